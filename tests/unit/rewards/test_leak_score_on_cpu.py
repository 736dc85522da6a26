"""``python -m agent_system.rewards.leak --score FILE.jsonl`` (agent_system/rewards/leak_score.py, docs/LEAK.md,
"Auditing the check on your own feedbacks"): the counts, the disagreements and the last line on a small file this test
writes; a committed held-out set scores as its own test asserts; every input it cannot read is named in one line (no
traceback); a reader threshold <= 0 is refused by name (the reader itself: test_leak_reader_on_cpu.py); the leak judge
(``--judge-model`` / ``--judge-base-url``, a real local HTTP server) joins the rules as in the trainer, its line
counts what it decided, and a half-set judge is refused by name. Reading and refusing start no process (fast tier);
scoring grades with the RewardPool (``external``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from chat_server import Request, chat_reply, chat_server, failure

from agent_system.rewards import RewardPool, leak_score
from agent_system.rewards.leak import main
from agent_system.rewards.leak_score import read_labelled, report, score_labelled

REPO = Path(__file__).resolve().parents[3]
LEAK_SETS = Path(__file__).parent / "leak_sets"
TOM = "Tom buys 3 books at 8 dollars each. How much does he pay in total, in dollars?"
# two labels the check agrees with and two it cannot agree with (a "leak" with no value in it, a stated answer
# labelled a near miss), so the counts do not move when the rules improve
SMALL = [
    {"problem": TOM, "ground_truth": "24", "feedback": "The answer is 24.", "leak": True},
    {
        "problem": TOM,
        "ground_truth": "24",
        "feedback": "Re-check step 24 of your work.",
        "leak": False,
        "attempt": "11",
    },
    None,  # an empty line: skipped, the line numbers still count it
    {"problem": "What is 2 + 2?", "ground_truth": 4, "feedback": "Count on your\nfingers again.", "leak": 1},
    {"problem": "What is 2 + 2?", "ground_truth": "4", "feedback": "The answer is 4.", "leak": 0},
]
SMALL_REPORT_END = [
    "disagreements:",
    '  line 4: missed leak (gold 4): "Count on your\\nfingers again."',
    '  line 5: false positive (gold 4): "The answer is 4."',
    "recall: 1/2 leaks caught (50.0 %)",
    "false positives: 1/2 near misses flagged (50.0 %)",
    "leak score: 2/4 right, 1 false positives, 1 misses",
]


def _write(path: Path, items) -> Path:
    path.write_text("".join(("" if i is None else json.dumps(i)) + "\n" for i in items), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=6.0) as reward_pool:  # generous: the machine may be busy
        yield reward_pool


@pytest.mark.external
def test_counts_disagreements_and_the_last_line(pool, tmp_path, capsys):
    path = _write(tmp_path / "small.jsonl", SMALL)
    assert main(["--score", str(path)], pool=pool) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: 4 labelled feedbacks (2 leaks, 2 near misses)"
    assert out[1:] == SMALL_REPORT_END


@pytest.mark.external
@pytest.mark.parametrize(
    ("name", "least_caught", "most_flagged"),
    [
        ("heldout_3", 24, 0),  # test_leak_on_cpu.py's HELD_OUT["heldout_3"], summed over the kinds
        ("heldout_4", 26, 1),  # test_leak_on_cpu.py::test_agreement_on_heldout_4
        # written without reading the rules (804c6a9), scored once with the check of ab71e63: 9 of 30 caught, 2 of 30
        # near misses flagged; its missed kinds then shaped the notation readers (issue 44), so it is no longer held
        # out: 20 of 30, 0 of 30 (docs/LEAK.md); a floor against regressions
        ("heldout_5", 20, 0),
        # written without reading the rules, committed (1cb9d70) before the notation readers, scored once before and
        # once after them: 7 of 30 caught, 3 of 30 flagged both times; its missed kinds then shaped the descriptions
        # (value_descriptions.py, issue 44), so it is no longer held out: 20 of 30, 3 of 30 (docs/LEAK.md)
        ("heldout_6", 20, 3),
        # written without reading the rules, with attempts, committed (f03edbb) before the descriptions, scored once
        # before and once after them: 6 then 7 of 30 caught, 0 of 30 flagged (docs/LEAK.md); a floor, never tuned on
        ("heldout_7", 7, 0),
    ],
)
def test_a_committed_held_out_set_scores_as_its_test_asserts(pool, tmp_path, capsys, name, least_caught, most_flagged):
    items = json.loads((LEAK_SETS / f"{name}.json").read_text())["items"]
    lines = [
        {"problem": i["problem"], "ground_truth": i["gold"], "feedback": i["feedback"], "leak": i["label"]}
        | ({"attempt": i["attempt"]} if isinstance(i.get("attempt"), str) else {})
        for i in items
    ]
    assert main(["--score", str(_write(tmp_path / f"{name}.jsonl", lines))], pool=pool) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    right, total, false_positives, misses = (int(n) for n in _numbers(last))
    leaks = sum(i["label"] for i in items)
    assert total == len(items) and right == total - false_positives - misses, last
    assert leaks - misses >= least_caught and false_positives <= most_flagged, last


def _numbers(last: str) -> list[str]:
    import re

    match = re.fullmatch(r"leak score: (\d+)/(\d+) right, (\d+) false positives, (\d+) misses", last)
    assert match, last
    return list(match.groups())


@pytest.mark.external
def test_the_module_runs_as_a_command(tmp_path):
    """``python -m agent_system.rewards.leak``: its own pool (spawned workers), and an error as one line."""
    path = _write(tmp_path / "small.jsonl", SMALL)
    command = [sys.executable, "-m", "agent_system.rewards.leak", "--score"]
    done = subprocess.run([*command, str(path), "--workers", "1"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-len(SMALL_REPORT_END) :] == SMALL_REPORT_END
    missing = subprocess.run([*command, str(tmp_path / "none.jsonl")], cwd=REPO, capture_output=True, text=True)
    assert missing.returncode == 2 and not missing.stdout
    assert missing.stderr.splitlines() == [
        f"python -m agent_system.rewards.leak: {tmp_path / 'none.jsonl'}: no such file"
    ]


GOOD = {"problem": "p", "ground_truth": "1", "feedback": "f", "leak": False}
BAD_FILES = [  # (lines written, what the one error line must say)
    ([GOOD, {k: v for k, v in GOOD.items() if k != "feedback"}], ["line 2: missing field 'feedback'"]),
    ([{"problem": "p"}], ["line 1: missing field 'ground_truth', 'feedback', 'leak'"]),
    ([GOOD, None, '{"problem": "p", '], ["line 3: invalid JSON"]),
    (["[1, 2]"], ["line 1: a line must be one JSON object", "(got a list)"]),
    ([{**GOOD, "leak": "yes"}], ["line 1: field 'leak' must be true / false or 1 / 0", '"yes"']),
    ([{**GOOD, "leak": 2}], ["line 1: field 'leak'"]),
    ([{**GOOD, "ground_truth": None}], ["line 1: field 'ground_truth' must be a non-empty string or number"]),
    ([{**GOOD, "ground_truth": True}], ["line 1: field 'ground_truth'"]),
    ([{**GOOD, "feedback": 3}], ["line 1: field 'feedback' must be a string (got a number)"]),
    ([{**GOOD, "attempt": ["x"]}], ["line 1: field 'attempt' must be a string (got a list)"]),
    ([None, None], ["no labelled feedbacks (every line is empty)"]),
]


@pytest.mark.parametrize(("lines", "says"), BAD_FILES)
def test_an_unreadable_file_is_named_in_one_line(tmp_path, capsys, lines, says):
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(("" if i is None else i if isinstance(i, str) else json.dumps(i)) + "\n" for i in lines))
    assert main(["--score", str(path)]) == 2  # refused before any pool starts (no process: the fast tier)
    captured = capsys.readouterr()
    assert not captured.out and len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith(f"python -m agent_system.rewards.leak: {path}")
    assert "Traceback" not in captured.err and all(part in captured.err for part in says), captured.err


def test_a_missing_file_a_folder_and_bytes_that_are_not_text(tmp_path, capsys):
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    for path, says in [
        (tmp_path / "none.jsonl", "no such file"),
        (tmp_path, "not a file"),
        (tmp_path / "binary.jsonl", "not UTF-8 text"),
    ]:
        assert main(["--score", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == f"python -m agent_system.rewards.leak: {path}: {says}" + err[err.index(says) + len(says) :]
        assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--score", "x.jsonl", "--reader", "m", "--reader-threshold", "0"], "--reader-threshold 0.0: a gain"),
        ([], "the following arguments are required: --score"),
        (["--score", "x.jsonl", "--workers", "0"], "need at least 1 worker"),
    ],
)
def test_a_refused_option_is_named_in_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_the_report_of_verdicts(tmp_path):
    """The counting alone: 3 leaks (one missed), 3 near misses (one flagged), and a feedback shortened to one line."""
    long = "x" * 200
    items = [{**GOOD, "leak": label, "feedback": text} for label, text in [(1, "a"), (1, "b"), (1, long)]]
    items += [{**GOOD, "leak": label} for label in (0, 0, 0)]
    path = _write(tmp_path / "six.jsonl", items)
    lines = read_labelled(path)
    score = score_labelled(lines, np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]))
    assert (score.right, score.caught, score.misses, score.false_positives) == (4, 2, 1, 1)
    page = report(score, path)
    assert page[-1] == "leak score: 4/6 right, 1 false positives, 1 misses"
    assert page[2] == f'  line 3: missed leak (gold 1): "{"x" * 160}" (+40 characters)'
    assert page[3] == '  line 5: false positive (gold 1): "f"'
    assert page[-3:-1] == ["recall: 2/3 leaks caught (66.7 %)", "false positives: 1/3 near misses flagged (33.3 %)"]
    assert report(score_labelled(lines[3:], np.zeros(3)), path)[1:] == [
        "recall: no leak is labelled",
        "false positives: 0/3 near misses flagged (0.0 %)",
        "leak score: 3/3 right, 0 false positives, 0 misses",
    ]


JUDGE_SEEN: list[Request] = []
JUDGED_END = [  # SMALL scored by the rules and the judge ``reads``
    "disagreements:",
    '  line 5: false positive (gold 4, flagged by rules, judge NO): "The answer is 4."',
    "leak judge reads at {url}: 4/4 decided, 0 failed or fell back to the rules, 1 leaks added that the rules missed, "
    "2 rule leaks disputed (they stay leaks)",
    "recall: 2/2 leaks caught (100.0 %)",
    "false positives: 1/2 near misses flagged (50.0 %)",
    "leak score: 3/4 right, 1 false positives, 0 misses",
]


def _judge_answer(request: Request) -> tuple[int, bytes]:
    """``reads`` says YES to "Count on your fingers again." only (SMALL's line 4, a leak the rules miss) and NO to
    every other feedback, the rules' two leaks among them; ``no`` says NO to all; the failing models fail
    (chat_server.failure)."""
    if (failed := failure(request)) is not None:
        return failed
    return 200, chat_reply("YES" if request.model == "reads" and "fingers again" in request.user else "NO")


@pytest.fixture(scope="module")
def judge_url():
    with chat_server(_judge_answer, JUDGE_SEEN) as url:
        yield url


def _with_judge(path: Path, url: str, model: str, *more: str) -> list[str]:
    return ["--score", str(path), "--judge-model", model, "--judge-base-url", url, *more]


@pytest.mark.external
def test_a_judge_yes_turns_a_miss_into_a_catch_and_its_no_clears_no_rule_leak(
    pool, judge_url, tmp_path, capsys, monkeypatch
):
    """The rules catch line 1 and flag line 5 (a near miss) and miss line 4; the judge says YES to line 4 only: line 4
    is caught, and its NO on lines 1 and 5 leaves both leaks (counted as disputed), as the trainer's penalty reads
    them. The key comes from the variable --judge-api-key-env names and is never printed."""
    monkeypatch.setenv("LEAK_AUDIT_KEY", "sk-audit")
    JUDGE_SEEN.clear()
    path = _write(tmp_path / "small.jsonl", SMALL)
    assert main(_with_judge(path, judge_url, "reads", "--judge-api-key-env", "LEAK_AUDIT_KEY"), pool=pool) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == [line.format(url=judge_url) for line in JUDGED_END]
    assert len(JUDGE_SEEN) == 4 and {request.auth for request in JUDGE_SEEN} == {"Bearer sk-audit"}
    assert "sk-audit" not in out


@pytest.mark.external
def test_a_judge_that_says_no_to_all_leaves_the_rules_score(pool, judge_url, tmp_path, capsys):
    path = _write(tmp_path / "small.jsonl", SMALL)
    assert main(_with_judge(path, judge_url, "no"), pool=pool) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:4] == [
        "disagreements:",
        '  line 4: missed leak (gold 4, judge NO): "Count on your\\nfingers again."',
        '  line 5: false positive (gold 4, flagged by rules, judge NO): "The answer is 4."',
    ]
    assert out[4].endswith(
        "4/4 decided, 0 failed or fell back to the rules, 0 leaks added that the rules missed, 2 rule leaks disputed "
        "(they stay leaks)"
    )
    assert out[5:] == SMALL_REPORT_END[-3:]


@pytest.mark.external
@pytest.mark.parametrize("model", ["error", "garbage", "unreachable"])
def test_a_failing_judge_keeps_the_rules_verdicts_and_is_counted(pool, judge_url, tmp_path, capsys, model):
    url = "http://127.0.0.1:9/v1" if model == "unreachable" else judge_url  # nothing listens on port 9
    path = _write(tmp_path / "small.jsonl", SMALL)
    assert main(_with_judge(path, url, model, "--judge-timeout-s", "2"), pool=pool) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:4] == [
        '  line 4: missed leak (gold 4, judge gave no verdict): "Count on your\\nfingers again."',
        '  line 5: false positive (gold 4, flagged by rules, judge gave no verdict): "The answer is 4."',
    ]
    assert out[4] == (
        f"leak judge {model} at {url}: 0/4 decided, 4 failed or fell back to the rules, 0 leaks added that the rules "
        "missed, 0 rule leaks disputed (they stay leaks)"
    )
    assert out[5:] == SMALL_REPORT_END[-3:]


@pytest.mark.external
def test_rules_judge_and_reader_join_as_in_the_trainer(pool, judge_url, tmp_path, capsys, monkeypatch):
    """With --reader too (its gains given here: the reader itself is test_leak_reader_on_cpu.py's), a feedback leaks
    when any of the three says so: the judge catches line 4, the reader flags line 2 (a near miss)."""
    monkeypatch.setattr(leak_score, "_load_reader", lambda name: object())
    monkeypatch.setattr(leak_score, "_gains", lambda reader, items: np.array([0.0, 3.0, 0.0, 0.0]))
    path = _write(tmp_path / "small.jsonl", SMALL)
    assert main([*_with_judge(path, judge_url, "reads"), "--reader", "gains"], pool=pool) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "disagreements:",
        '  line 2: false positive (gold 24, flagged by reader, judge NO, reader gain 3.00): "Re-check step 24 of your '
        'work."',
        '  line 5: false positive (gold 4, flagged by rules, judge NO, reader gain 0.00): "The answer is 4."',
        JUDGED_END[2].format(url=judge_url),
        "reader gains: 1/4 feedbacks with a gain >= 2 nats (mean gain 0.75 nats)",
        "recall: 2/2 leaks caught (100.0 %)",
        "false positives: 2/2 near misses flagged (100.0 %)",
        "leak score: 2/4 right, 2 false positives, 0 misses",
    ]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--judge-model", "qwen"], "--judge-model='qwen' and --judge-base-url=None: set both to use a judge"),
        (["--judge-base-url", "http://h/v1"], "--judge-model=None and --judge-base-url='http://h/v1': set both"),
        (["--judge-model", "q", "--judge-base-url", "http://h/v1", "--judge-timeout-s", "0"], "--judge-timeout-s=0.0"),
        (["--judge-timeout-s", "5"], "--judge-timeout-s without a judge: name one with --judge-model and"),
    ],
)
def test_a_half_set_judge_is_refused_by_name_in_one_line(capsys, monkeypatch, options, says):
    monkeypatch.delenv("MLMT_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("MLMT_JUDGE_MODEL", raising=False)
    with pytest.raises(SystemExit) as stop:
        main(["--score", "x.jsonl", *options])  # refused before the file is read or any pool starts
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
