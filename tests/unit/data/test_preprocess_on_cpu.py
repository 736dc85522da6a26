"""Preprocessors on the shared datasets (small slices) and on deliberately broken inputs."""

import json
import os

import pandas as pd
import pytest
from shared_data import shared_data

from agent_system.data.preprocess import main, preprocess
from agent_system.data.schema import DataFormatError, validate_row
from agent_system.rewards import compute_score


def _read(path):
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for row in frame.to_dict(orient="records"):
        row["prompt"] = list(row["prompt"])
        validate_row(row)
    return frame


@pytest.mark.external
@pytest.mark.parametrize(
    ("dataset", "input_rel", "split", "source", "ability", "expected_split"),
    [
        ("math", "math", "train", "math", "math", "train"),
        ("math", "math/test.jsonl", None, "math", "math", "test"),
        ("math500", "math500", None, "math500", "math", "test"),
        ("gsm8k", "gsm8k/test.jsonl", None, "gsm8k", "math", "test"),
        ("mbpp", "mbpp", "train", "mbpp", "code", "train"),
        ("mbpp_sanitized", "mbpp/sanitized-mbpp.jsonl", None, "mbpp", "code", "prompt"),  # task ids 2-10
    ],
)
def test_shared_data_to_valid_parquet(tmp_path, dataset, input_rel, split, source, ability, expected_split):
    out = tmp_path / f"{dataset}.parquet"
    path, count, bad = preprocess(dataset, str(out), str(shared_data(input_rel)), split=split, limit=40)
    assert count == 40 and bad == [] and path == str(out)
    frame = _read(out)
    assert set(frame.data_source) == {source} and set(frame.ability) == {ability}
    extra = frame.extra_info.iloc[0]
    assert extra["split"] == expected_split and extra["index"] == 0 and extra["reference_solution"]
    assert list(frame.extra_info.map(lambda e: e["index"])) == list(range(40))
    prompt = frame.prompt.iloc[0]
    assert len(prompt) == 1 and prompt[0]["role"] == "user"
    if ability == "code":
        assert json.loads(frame.reward_model.iloc[0]["ground_truth"])[0].startswith("assert")
        assert extra["entry_point"] and "test_setup_code" in extra
        for row in frame.itertuples():  # the first test is shown (name and signature), the others stay hidden
            tests, content = json.loads(row.reward_model["ground_truth"]), row.prompt[0]["content"]
            assert content.endswith("\n\nYour code should pass this test, among others:\n" + tests[0])
            assert len(tests) > 1 and not any(test in content for test in tests[1:])
    # the reference solution of each row earns full reward (math only here; code is covered by the sandbox tests)
    if ability == "math":
        for row in frame.head(10).itertuples():
            reference, gold = row.extra_info["reference_solution"], row.reward_model["ground_truth"]
            assert compute_score(row.data_source, reference, gold)["acc"]


@pytest.mark.external
def test_full_math500_and_gsm8k_test_counts(tmp_path):
    assert preprocess("math500", str(tmp_path / "a.parquet"), str(shared_data("math500")))[1] == 500
    assert preprocess("gsm8k", str(tmp_path / "b.parquet"), str(shared_data("gsm8k")), split="test")[1] == 1319
    gold = pd.read_parquet(tmp_path / "a.parquet").reward_model.iloc[0]["ground_truth"]
    assert gold == "\\left( 3, \\frac{\\pi}{2} \\right)"


def _write_jsonl(path, rows):
    with open(path, "w") as handle:
        for row in rows:
            handle.write(row if isinstance(row, str) else json.dumps(row))
            handle.write("\n")


def test_bad_rows_name_file_row_and_field(tmp_path):
    source = tmp_path / "test.jsonl"
    good = {"question": "1+1?", "answer": "1+1=2\n#### 2"}
    _write_jsonl(source, [good, {"question": "2+2?", "answer": "four"}, "{not json", {"answer": "#### 3"}, good])
    out = tmp_path / "out.parquet"
    with pytest.raises(DataFormatError) as info:
        preprocess("gsm8k", str(out), str(source))
    assert info.value.path == str(source) and info.value.row == 2 and info.value.field == "answer"
    assert "row 2" in str(info.value) and "test.jsonl" in str(info.value)
    assert not out.exists() and os.listdir(tmp_path) == ["test.jsonl"]  # no half-written or temporary file

    _, count, bad = preprocess("gsm8k", str(out), str(source), skip_bad_rows=True)
    assert count == 2 and [(e.row, e.field) for e in bad] == [(2, "answer"), (3, "<json>"), (4, "question")]


def test_bad_mbpp_and_math_rows(tmp_path):
    mbpp = tmp_path / "mbpp.jsonl"
    _write_jsonl(mbpp, [{"task_id": 700, "text": "t", "code": "def f(): pass", "test_list": [], "test_setup_code": ""}])
    with pytest.raises(DataFormatError, match="field 'test_list'"):
        preprocess("mbpp", str(tmp_path / "o.parquet"), str(mbpp))
    math = tmp_path / "train.jsonl"
    _write_jsonl(math, [{"problem": "p", "solution": "there are $\\boxed{}$ primes", "level": "Level 1", "type": "x"}])
    with pytest.raises(DataFormatError, match="row 1: field 'solution'"):
        preprocess("math", str(tmp_path / "o.parquet"), str(math))
    with pytest.raises(ValueError, match="no rows"):
        preprocess("math", str(tmp_path / "o.parquet"), str(math), skip_bad_rows=True)


@pytest.mark.external
def test_parquet_input_and_cli(tmp_path, caplog):
    first = tmp_path / "first.parquet"
    main(["--dataset", "mbpp", "--input", str(shared_data("mbpp")), "--split", "validation", "--output", str(first)])
    assert len(_read(first)) == 90
    raw = tmp_path / "raw" / "sanitized-mbpp.parquet"
    raw.parent.mkdir()
    pd.read_json(shared_data("mbpp", "sanitized-mbpp.jsonl"), lines=True).head(30).to_parquet(raw)
    path, count, _ = preprocess("mbpp_sanitized", str(tmp_path / "s.parquet"), str(raw.parent))
    assert count == 30 and _read(path).extra_info.iloc[0]["variant"] == "sanitized"
    with pytest.raises(FileNotFoundError):
        preprocess("gsm8k", str(tmp_path / "x.parquet"), str(tmp_path / "missing"))
