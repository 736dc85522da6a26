"""Grading of YAML-defined tasks (agent_system/rewards/yaml_reward.py) in the real sandbox: the done_fn cut, one
sandbox process per batch, and every way a task's function can fail scoring 0 with the function, the item and the
exception named, counted by the RewardPool, never raising in the caller."""

import logging
import socket
from pathlib import Path

import pytest

from agent_system.data.yaml_task import load_task, task_rows
from agent_system.rewards import RewardPool, compute_score
from agent_system.rewards.code_sandbox import SandboxLimits, isolation_mode
from agent_system.rewards.yaml_reward import Request, find_cuts, grade, score_batch

pytestmark = pytest.mark.external  # score_fn and done_fn run in the sandbox's subprocess

EXAMPLES = Path(__file__).resolve().parents[3] / "recipes" / "custom_yaml"
ROOMY = SandboxLimits(timeout_s=60.0, per_test_s=30.0)  # never reached by calls that finish, even under load
CONTEXT = "<|im_start|>user\nName the best language.<|im_end|>\n<|im_start|>assistant\n"
LIST = "1. C: fast\n2. Go: simple\n3. Rust: safe\n"


def _score_only(body: str) -> dict[str, str]:
    return {"score_fn": "def score_fn(text, answer):\n" + "".join(f"    {line}\n" for line in body.splitlines())}


def test_best_lang_is_graded_up_to_the_done_fn_cut():
    sources = load_task(str(EXAMPLES / "best_lang.yaml")).sources
    right = LIST + "The best programming language is Rust. But Python is nice.\n"
    wrong_then_right = LIST + "The best programming language is Python. Actually Rust"
    never_done = LIST + "The best programming language is Rust"  # no "." after it: done_fn never holds
    grades = grade(sources, [Request(r, "Rust", CONTEXT, label=f"r{i}") for i, r in enumerate(
        [right, wrong_then_right, never_done])], ROOMY)  # fmt: skip
    assert [g.score for g in grades] == [1.0, 0.0, 1.0] and all(g.error is None for g in grades)
    assert grades[0].graded_text == LIST + "The best programming language is Rust."
    assert grades[0].done_at == len(grades[0].graded_text)  # character pieces by default
    assert grades[1].graded_text.endswith("Python.")  # " Actually Rust" is after the episode's end
    assert grades[2].done_at is None and grades[2].graded_text == never_done
    # utterance ends (split_fn on the text since the previous end): after each of the three list lines
    assert grades[0].utterance_ends == [LIST.index("\n") + 1, LIST.index("\n", 11) + 1, len(LIST)]
    # without done_fn the whole response is graded: the same second response then scores 1
    whole = grade({"score_fn": sources["score_fn"]}, [Request(wrong_then_right, "Rust", CONTEXT)], ROOMY)
    assert whole[0].score == 1.0 and whole[0].done_at is None


def test_cuts_are_counted_in_token_pieces():
    sources = load_task(str(EXAMPLES / "best_lang.yaml")).sources
    pieces = ["1. C", "\n", "The best", " programming language", " is Rust", ".", "\n", "more"]
    cuts = find_cuts(sources, [CONTEXT], [pieces], ROOMY)
    assert cuts[0].done_at == 6 and cuts[0].utterance_ends == [2] and cuts[0].error is None
    with pytest.raises(ValueError, match="do not concatenate"):
        grade(sources, [Request("abc", "x", pieces=["a", "b"])], ROOMY)


def test_one_sandbox_process_grades_the_whole_batch():
    # module state survives from one call to the next only inside one process: scores 0.01, 0.02, ... in order
    sources = {
        "score_fn": "CALLS = []\ndef score_fn(text, answer):\n    CALLS.append(text)\n    return len(CALLS) / 100\n"
    }
    grades = grade(sources, [Request(f"r{i}", "a") for i in range(12)], ROOMY)
    assert [g.score for g in grades] == pytest.approx([(i + 1) / 100 for i in range(12)])


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        ("return 1 / 0", "score_fn raised ZeroDivisionError: division by zero"),
        ("return 'yes'", "score_fn returned 'yes' (str), not a bool or a finite number"),
        ("return None", "score_fn returned None (NoneType)"),
        ("return float('nan')", "not a bool or a finite number"),
        ("return 2.5", "score_fn returned 2.5, outside [0, 1]"),
        ("raise SystemExit(3)", "score_fn raised SystemExit: 3"),
    ],
)
def test_a_failing_score_fn_scores_zero_and_is_named(body, phrase):
    sources = _score_only("if text == 'bad':\n    " + body + "\nreturn 1.0")
    grades = grade(sources, [Request("fine", "a", label="t.yaml item 0"), Request("bad", "a", label="t.yaml item 1")],
                   ROOMY)  # fmt: skip
    assert grades[0].score == 1.0 and grades[0].error is None  # the batch goes on past a failing call
    assert grades[1].score == 0.0 and grades[1].error.startswith("t.yaml item 1: ") and phrase in grades[1].error


def test_a_looping_score_fn_is_stopped_and_the_batch_goes_on():
    sources = _score_only("while text == 'loop':\n    pass\nreturn 1.0")
    limits = SandboxLimits(timeout_s=60.0, per_test_s=30.0)
    grades = grade(sources, [Request("loop", "a", label="item 0"), Request("ok", "a", label="item 1")], limits)
    assert grades[0].score == 0.0 and "score_fn raised TimeLimitExceeded" in grades[0].error
    assert grades[1].score == 1.0


def test_defining_the_sources_is_not_held_to_a_calls_limit():
    """The program stage (the task's sources defined) has the run's per-test limit, each call 1 s (``CALL_S``): a
    definition that takes 1.5 s (a busy machine) still grades, where it once scored every response 0."""
    sources = {"score_fn": "import time\ntime.sleep(1.5)\n\ndef score_fn(text, answer):\n    return 1.0\n"}
    grades = grade(sources, [Request("x", "a", label="item 0")], SandboxLimits(timeout_s=60.0, per_test_s=30.0))
    assert grades[0].error is None and grades[0].score == 1.0, grades[0]


def test_done_fn_and_definition_errors_are_named():
    sources = {
        "score_fn": "def score_fn(text, answer):\n    return 1.0\n",
        "done_fn": "def done_fn(text):\n    return text.endswith('!') and [1][5]\n",
    }
    grades = grade(sources, [Request("ab!", "a", label="item 4")], ROOMY)
    assert grades[0].score == 0.0 and grades[0].error == "item 4: done_fn raised IndexError: list index out of range"
    broken = {"score_fn": "import no_such_module_xyz\ndef score_fn(text, answer):\n    return 1.0\n"}
    grades = grade(broken, [Request("x", "a", label="item 0")], ROOMY)
    assert "score_fn could not be defined: ModuleNotFoundError" in grades[0].error and grades[0].score == 0.0
    flag = {**sources, "done_fn": "def done_fn(text):\n    return 'maybe'\n"}
    assert "done_fn returned 'maybe' (str), not a bool" in grade(flag, [Request("x", "a")], ROOMY)[0].error


def test_the_sandbox_stops_file_writes_outside_its_dir_and_network(outside_tmp):
    if isolation_mode() != "root":
        pytest.skip("file protection relies on the per-run unprivileged uid (root mode)")
    victim = outside_tmp / "precious.txt"
    victim.write_text("keep me")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    attack = (
        "import os, socket\n"
        "def score_fn(text, answer):\n"
        "    done = 0\n"
        f"    for act in (lambda: open({str(victim)!r}, 'w').write('x'), lambda: os.remove({str(victim)!r}),\n"
        f"                lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1)):\n"
        "        try:\n            act()\n            done += 1\n        except OSError:\n            pass\n"
        "    open('inside.txt', 'w').write('ok')\n"  # its own temp dir is writable
        "    return 1.0 if done == 0 and open('inside.txt').read() == 'ok' else 0.0\n"
    )
    server.settimeout(0.1)
    try:
        grades = grade({"score_fn": attack}, [Request("x", "a")], ROOMY)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert grades[0].error is None and grades[0].score == 1.0  # every attack failed inside the sandbox
    assert victim.read_text() == "keep me"


def test_reward_pool_batches_yaml_items_and_counts_failures(caplog):
    task = load_task(str(EXAMPLES / "arith_words.yaml"))
    rows = task_rows(task)[:3]
    # the second response's last number is 99, after done_fn's cut ("Answer: N" and a line end): graded right
    responses = ["working\nAnswer: {}\n", "Answer: {}\nor maybe 99", "no number"]
    items = [
        {"data_source": "yaml_task", "solution_str": responses[i].format(row["reward_model"]["ground_truth"]),
         "ground_truth": row["reward_model"]["ground_truth"], "extra_info": row["extra_info"], "prompt_str": CONTEXT}
        for i, row in enumerate(rows)
    ]  # fmt: skip
    broken_extra = {**rows[0]["extra_info"], "score_fn": "def score_fn(text, answer):\n    return {}[answer]\n"}
    items.append({**items[0], "extra_info": broken_extra})
    items.insert(1, {"data_source": "arith", "solution_str": "\\boxed{3}", "ground_truth": "3", "extra_info": None})
    with caplog.at_level(logging.WARNING, logger="agent_system.rewards.pool"), RewardPool(1, timeout_s=60.0) as pool:
        results = pool.score(items)
        assert pool.yaml_failures == 1
    assert [r["score"] for r in results] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert results[2]["pred"] == "Answer: 9\n" and results[3]["error"] is None  # no number: a wrong answer
    assert results[4]["error"].endswith("item 0: score_fn raised KeyError: '14'")
    assert "yaml_task grading: 1 of 4 responses scored 0 on an error" in caplog.text


def test_compute_score_grades_one_yaml_row():
    row = task_rows(load_task(str(EXAMPLES / "best_lang.yaml")))[0]
    args = ("yaml_task", LIST + "The best programming language is Rust.", "Rust", row["extra_info"])
    result = compute_score(*args, prompt_str=CONTEXT, sandbox_limits=ROOMY)
    assert result["score"] == 1.0 and result["acc"] and result["error"] is None
    assert score_batch([{"solution_str": "x", "ground_truth": "Rust", "extra_info": {}}])[0]["error"].endswith(
        "the row has no score_fn in extra_info"
    )
