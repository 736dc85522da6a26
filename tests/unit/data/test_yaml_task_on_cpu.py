"""YAML-defined tasks (agent_system/data/yaml_task.py): the shipped examples load and convert, and every bad file is
refused with the file, the item and the field named (no function is executed while loading)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from agent_system.data.schema import validate_row
from agent_system.data.yaml_task import YamlTaskError, load_task, task_rows
from agent_system.prompts.templates import PromptBuilder, Task

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "recipes" / "custom_yaml"
SCORE = "score_fn: |\n  def score_fn(text, answer):\n    return answer in text\n"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return str(path)


def test_best_lang_is_recurves_example(tmp_path):
    task = load_task(str(EXAMPLES / "best_lang.yaml"))
    assert task.main_prompt == "You are a helpful assistant."
    assert [answer for _, answer in task.items] == ["Rust"]
    assert set(task.sources) == {"score_fn", "done_fn", "split_fn"}
    assert task.prompt(0).startswith("You are a helpful assistant.\n\nCreate a list of 3 compiled")
    row = task_rows(task)[0]
    validate_row(row)
    assert row["data_source"] == "yaml_task" and row["reward_model"]["ground_truth"] == "Rust"
    assert row["extra_info"]["score_fn"] == task.sources["score_fn"] and row["extra_info"]["item_index"] == 0
    # the yaml templates: turn 1 is the task's own prompt, unchanged
    assert PromptBuilder().template(PromptBuilder.name("solve", Task.from_row(row).kind)) == "{problem}"


def test_numbers_become_string_answers_and_missing_functions_are_optional(tmp_path):
    task = load_task(_write(tmp_path, "items:\n  - {prompt: 'one plus one?', answer: 2}\n" + SCORE))
    assert task.items == [("one plus one?", "2")] and set(task.sources) == {"score_fn"}
    assert task_rows(task)[0]["extra_info"]["done_fn"] == ""


@pytest.mark.parametrize(
    ("text", "item", "field", "phrase"),
    [
        (SCORE, None, "items", "is missing"),
        ("items: []\n" + SCORE, None, "items", "non-empty list"),
        ("items:\n  - {prompt: a, answer: b}\n  - {answer: c}\n" + SCORE, 1, "prompt", "is missing"),
        ("items:\n  - {prompt: a, answer: b}\n  - {prompt: a}\n" + SCORE, 1, "answer", "is missing"),
        ("items:\n  - {prompt: a, answer: [1]}\n" + SCORE, 0, "answer", "a string or a number"),
        ("items:\n  - {prompt: a, answer: b, hint: c}\n" + SCORE, 0, "hint", "unknown key"),
        ("items:\n  - just a string\n" + SCORE, 0, "items", "a mapping"),
        ("items:\n  - {prompt: a, answer: b}\n", None, "score_fn", "is missing"),
        ("items:\n  - {prompt: a, answer: b}\nscore_fn: |\n  def scorer(text, answer):\n    return 1\n", None,
         "score_fn", "does not define a top-level function 'score_fn'"),
        ("items:\n  - {prompt: a, answer: b}\nscore_fn: |\n  def score_fn(text):\n    return 1\n", None,
         "score_fn", "2 positional"),
        ("items:\n  - {prompt: a, answer: b}\n" + SCORE + "done_fn: 3\n", None, "done_fn", "non-empty string"),
        ("items:\n  - {prompt: a, answer: b}\n" + SCORE + "stop_fn: x\n", None, "stop_fn", "unknown key"),
        ("items: [a: b\n", None, "<yaml>", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_files_name_the_item_and_the_field(tmp_path, text, item, field, phrase):
    path = _write(tmp_path, text)
    with pytest.raises(YamlTaskError) as caught:
        load_task(path)
    message = str(caught.value)
    assert message.startswith(path + ": ") and f"field {field!r}" in message and phrase in message, message
    assert caught.value.item == item and (f"item {item}:" in message) == (item is not None), message


def test_a_syntax_error_reports_its_line_in_the_file(tmp_path):
    text = (
        "items:\n"  # line 1
        "  - {prompt: a, answer: b}\n"  # 2
        + SCORE  # 3-5
        + "split_fn: |\n"  # 6
        "  def split_fn(output):\n"  # 7
        "    return output.endswith(\n"  # 8
        "  x = = 1\n"  # 9
    )
    with pytest.raises(YamlTaskError, match=r"field 'split_fn': syntax error at line 8 of the file"):
        load_task(_write(tmp_path, text))


def test_loading_never_runs_the_functions(tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\ndef score_fn(text, answer):\n  return 1\n"
    load_task(_write(tmp_path, "items:\n  - {prompt: a, answer: b}\nscore_fn: " + json.dumps(source) + "\n"))
    assert not marker.exists()


@pytest.mark.external
@pytest.mark.parametrize("name", ["best_lang", "arith_words"])
def test_preprocess_cli_on_the_shipped_examples(tmp_path, name):
    out = tmp_path / f"{name}.parquet"
    command = [sys.executable, "-m", "agent_system.data.preprocess", "--dataset", "yaml"]
    command += ["--input", str(EXAMPLES / f"{name}.yaml"), "--output", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    frame = pd.read_parquet(out)
    task = load_task(str(EXAMPLES / f"{name}.yaml"))
    assert len(frame) == len(task.items) and set(frame.data_source) == {"yaml_task"}
    for index, row in enumerate(frame.to_dict("records")):
        assert row["prompt"][0]["content"] == task.prompt(index)
        assert row["reward_model"]["ground_truth"] == task.items[index][1]
        assert row["extra_info"]["score_fn"] == task.sources["score_fn"]


@pytest.mark.external
def test_preprocess_cli_reports_a_bad_file(tmp_path):
    bad = _write(tmp_path, "items:\n  - {prompt: a}\n" + SCORE)
    command = [sys.executable, "-m", "agent_system.data.preprocess", "--dataset", "yaml", "--input", bad]
    result = subprocess.run([*command, "--output", str(tmp_path / "o.parquet")], capture_output=True, text=True)
    assert result.returncode != 0 and "item 0: field 'answer': is missing" in result.stderr
    assert not (tmp_path / "o.parquet").exists()
