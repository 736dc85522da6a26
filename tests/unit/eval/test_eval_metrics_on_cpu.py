"""The MATH-500 evaluator's metrics, argument checks, resumable record store and paired comparison (no models)."""

from __future__ import annotations

import argparse
import json

import pytest

from agent_system.eval.math500 import (
    RESULT_KEYS,
    EvalSettingsError,
    RecordStore,
    compare_runs,
    summarize,
    summary_markdown,
    validate,
)


def _record(index: int, samples: list[list[bool]], mode: str = "feedback", **fields) -> dict:
    per_turn = 2 if mode == "feedback" else 1
    out = []
    for correct in samples:
        count = 1 + per_turn * (len(correct) - 1)
        out.append(
            {
                "turns": ["x"] * count,
                "truncated": [False] * count,
                "correct": correct,
                "answer": ["1" if c else "2" for c in correct],
                "outcome": ["correct" if c else "wrong" for c in correct],
                "lenient": fields.get("lenient", correct),
                "judge": fields.get("judge", ["not_asked"] * len(correct)),
            }
        )
    extra = {k: fields[k] for k in ("subject", "level", "unique_id") if k in fields}
    return {"index": index, "problem": f"p{index}", "ground_truth": "1", **extra, "samples": out}


def test_feedback_metrics_count_transitions_and_the_oracle():
    records = [
        _record(0, [[False, True]]),  # wrong → right: i→c
        _record(1, [[True, False]]),  # right → wrong: c→i
        _record(2, [[True, True]]),
        _record(3, [[False, False]]),
    ]
    s = summarize(records, "feedback")
    assert (s["greedy_acc@t1"], s["greedy_acc@t3"], s["greedy_final_acc"]) == (0.5, 0.5, 0.5)
    assert (s["i_to_c"], s["c_to_i"], s["delta_t1_final"]) == (0.25, 0.25, 0.0)
    assert s["solved_any_turn"] == 0.75  # the oracle counts problem 1, the final answer does not
    assert "pass@1_t1" not in s


def test_turn_numbers_follow_the_mode_and_rounds():
    two_rounds = [_record(0, [[False, False, True]])]
    assert {"greedy_acc@t1", "greedy_acc@t3", "greedy_acc@t5"} <= summarize(two_rounds, "feedback").keys()
    self_correct = [_record(0, [[False, False, True]], "self_correct")]
    s = summarize(self_correct, "self_correct")
    assert {"greedy_acc@t1", "greedy_acc@t2", "greedy_acc@t3"} <= s.keys()
    assert s["greedy_final_acc"] == 1.0 and "truncated_feedback" not in s


def test_greedy_and_sampled_accuracies_have_different_names():
    """One sample: turn 1 is greedy, later turns sampled at T > 0; k samples: every turn is sampled."""
    records = [_record(0, [[True, False]]), _record(1, [[False, False]])]
    s = summarize(records, "feedback", temperature=0.7)
    assert s["greedy_acc@t1"] == 0.5 and s["sampled_acc@t3"] == 0.0 and s["sampled_final_acc"] == 0.0
    assert "acc@t1" not in s and "sampled_acc@t1" not in s and s["decoding"] == {"t1": "greedy", "t3": "sampled"}
    k = summarize([_record(0, [[True, True], [False, True]])], "feedback", temperature=1.0)
    assert k["sampled_acc@t1"] == 0.5 and "greedy_acc@t1" not in k


def test_pass_at_k_is_the_unbiased_estimate_for_every_k():
    # problem 0: 1 of 4 samples right at the end; problem 1: 3 of 4; problem 2: none
    records = [
        _record(0, [[False, False], [False, True], [False, False], [False, False]]),
        _record(1, [[True, True], [True, True], [False, True], [False, False]]),
        _record(2, [[False, False]] * 4),
    ]
    s = summarize(records, "feedback", temperature=1.0)
    assert s["samples_per_problem"] == 4
    # 1 − C(n−c, k)/C(n, k): c=1 → 1/4, 1/2, 3/4, 1; c=3 → 3/4, 1, 1, 1; c=0 → 0
    expected = {1: (0.25 + 0.75) / 3, 2: (0.5 + 1) / 3, 3: (0.75 + 1) / 3, 4: 2 / 3}
    assert {k: s[f"pass@{k}_final"] for k in range(1, 5)} == pytest.approx(expected)
    assert s["pass@1_final"] == pytest.approx(s["sampled_final_acc"])  # pass@1 is the mean over samples
    assert s["pass@2_t1"] == pytest.approx((0 + 1 - 1 / 6 + 0) / 3)  # c=2 of 4 at turn 1 for problem 1


def test_every_accuracy_has_a_95_interval_wilson_or_bootstrap():
    records = [_record(i, [[i % 2 == 0, i % 3 == 0]]) for i in range(10)]
    s = summarize(records, "feedback")
    low, high, method = s["ci95"]["greedy_acc@t1"]
    assert method == "wilson" and (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # 5 of 10
    assert all(name in s["ci95"] for name in s if "acc" in name or name.startswith(("pass@", "solved")))
    sampled = summarize([_record(i, [[i % 2 == 0, True], [False, True]]) for i in range(6)], "feedback", 1.0)
    low, high, method = sampled["ci95"]["sampled_acc@t1"]
    assert method == "bootstrap" and low < sampled["sampled_acc@t1"] < high


def test_lenient_and_judge_columns_are_reported_beside_the_strict_one():
    records = [
        _record(0, [[False, False]], lenient=[True, True], judge=["no", "yes"]),
        _record(1, [[True, True]]),
    ]
    s = summarize(records, "feedback", judged=True)
    assert s["greedy_final_acc"] == 0.5 and s["greedy_final_acc_lenient"] == 1.0
    assert s["greedy_acc@t1_judge"] == 0.5 and s["greedy_final_acc_judge"] == 1.0
    assert s["judge_verdicts"]["t3"] == {"not_asked": 1, "yes": 1, "no": 0, "failed": 0}
    assert "_judge" not in "".join(summarize(records, "feedback"))


def test_outcomes_are_counted_per_turn():
    record = _record(0, [[False, True]])
    record["samples"][0]["outcome"] = ["timeout", "correct"]
    other = _record(1, [[False, False]])
    other["samples"][0]["outcome"] = ["no_answer", "truncated"]
    s = summarize([record, other], "feedback")
    assert s["outcomes"]["t1"] == {"correct": 0, "wrong": 0, "no_answer": 1, "truncated": 0, "timeout": 1, "error": 0}
    assert s["outcomes"]["t3"]["truncated"] == 1 and s["outcomes"]["t3"]["correct"] == 1


def test_breakdown_by_subject_and_level_and_the_markdown():
    records = [
        _record(0, [[True, True]], subject="Algebra", level="1"),
        _record(1, [[False, True]], subject="Algebra", level="5"),
        _record(2, [[False, False]], subject="Geometry", level="5"),
    ]
    s = summarize(records, "feedback")
    assert s["by_subject"]["Algebra"]["problems"] == 2 and s["by_subject"]["Algebra"]["greedy_acc@t1"][0] == 0.5
    assert s["by_subject"]["Geometry"]["greedy_final_acc"][:2] == [0.0, 0.0]
    assert s["by_level"]["5"]["greedy_final_acc_lenient"][0] == 0.5
    settings = {"mode": "feedback", "ll": "L", "hl": "H", "data": "d", "rounds": 1, "samples": 1, "temperature": 0}
    md = summary_markdown(s, {**settings, "judge": None})
    assert "| Algebra | 2 | 0.500 [" in md and "## by level" in md and "lenient" in md
    assert "| greedy_acc@t1 | 0.3333 | [0.0615, 0.7923] (wilson) |" in md
    assert "judge: none (rule-based grading only)" in md


def _args(**kw) -> argparse.Namespace:
    base = {"hl": None, "self_correct": False, "rounds": None, "samples": 1, "temperature": 0.0}
    judge = {"judge_model": None, "judge_base_url": None, "judge_api_key_env": None, "judge_timeout_s": None}
    return argparse.Namespace(**{**base, **judge, **kw})  # as add_judge_options leaves the options not given


def test_modes_and_argument_errors():
    args = _args(hl="H")
    validate(args)
    assert (args.mode, args.rounds) == ("feedback", 1)
    args = _args()
    validate(args)
    assert (args.mode, args.rounds) == ("single", 0)
    with pytest.raises(EvalSettingsError, match="--hl and --self-correct"):
        validate(_args(hl="H", self_correct=True))
    with pytest.raises(EvalSettingsError, match="--rounds 2 needs --hl or --self-correct"):
        validate(_args(rounds=2))
    with pytest.raises(EvalSettingsError, match="--temperature > 0"):
        validate(_args(hl="H", samples=4))


def test_no_hidden_judge_a_named_one_is_recorded_without_its_key(monkeypatch):
    monkeypatch.delenv("MLMT_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("MLMT_JUDGE_MODEL", raising=False)
    args = _args()
    validate(args)
    assert args.judge is None and args.judge_config is None and "judge" in RESULT_KEYS
    monkeypatch.setenv("MY_KEY", "sk-secret")
    args = _args(judge_model="qwen", judge_base_url="http://h/v1", judge_api_key_env="MY_KEY")
    validate(args)
    assert args.judge == {"model": "qwen", "base_url": "http://h/v1", "timeout_s": 10.0, "api_key_env": "MY_KEY"}
    assert args.judge_config.api_key == "sk-secret" and "sk-secret" not in json.dumps(args.judge)
    with pytest.raises(EvalSettingsError, match="--judge-model='qwen' and --judge-base-url=None"):
        validate(_args(judge_model="qwen"))
    for alone in ({"judge_timeout_s": 30.0}, {"judge_api_key_env": "MY_KEY"}):  # a setting that cannot act
        with pytest.raises(
            EvalSettingsError, match="without a judge: name one with --judge-model and --judge-base-url"
        ):
            validate(_args(**alone))
    monkeypatch.setenv("MLMT_JUDGE_MODEL", "qwen")  # the former switch: refused, not silently used or ignored
    with pytest.raises(EvalSettingsError, match="MLMT_JUDGE_MODEL set in the environment.*--judge-model"):
        validate(_args())


def test_store_resumes_drops_a_cut_line_and_refuses_other_settings(tmp_path):
    settings = {"ll": "a", "hl": "b", "mode": "feedback", "rounds": 1, "records_version": 2, "judge": None}
    store = RecordStore(str(tmp_path), settings)
    store.add([_record(0, [[True, True]]), _record(1, [[False, True]])])
    with (tmp_path / "records.jsonl").open("a") as handle:
        handle.write('{"index": 2, "probl')  # a kill in the middle of a write
    again = RecordStore(str(tmp_path), settings)
    assert sorted(again.records) == [0, 1]
    assert [json.loads(line)["index"] for line in (tmp_path / "records.jsonl").read_text().splitlines()] == [0, 1]
    with pytest.raises(EvalSettingsError, match="rounds: 1 there, 2 now"):
        RecordStore(str(tmp_path), {**settings, "rounds": 2})
    with pytest.raises(EvalSettingsError, match="problem 1 differs"):
        again.check_problem(1, "another problem")
    judged = {**settings, "judge": {"model": "m", "base_url": "u", "timeout_s": 10.0, "api_key_env": "K"}}
    with pytest.raises(EvalSettingsError, match="judge: None there"):
        RecordStore(str(tmp_path), judged)
    old = tmp_path / "old"
    RecordStore(str(old), {k: v for k, v in settings.items() if k not in ("records_version", "judge")})
    with pytest.raises(EvalSettingsError, match="records_version: None there, 2 now"):
        RecordStore(str(old), settings)  # records without answers and outcomes are not mixed with new ones


def _write_run(path, records) -> str:
    path.mkdir()
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_compare_runs_exact_mcnemar_on_the_shared_problems(tmp_path):
    # A: right on 0..9; B: right on 0..9 and on 10..19 (10 discordant, all for B); B alone has problem 99
    a = [_record(i, [[i < 10, i < 10]], unique_id=f"u{i}") for i in range(30)]
    b = [_record(i, [[i < 20, i < 20]], unique_id=f"u{i}") for i in range(30)]
    b.append(_record(99, [[True, True]], unique_id="u99"))
    result = compare_runs(_write_run(tmp_path / "a", a), _write_run(tmp_path / "b", b))
    assert result["shared_problems"] == 30
    final = result["tests"]["final"]
    assert (final["acc_a"], final["acc_b"], final["a_better"], final["b_better"]) == (10 / 30, 20 / 30, 0, 10)
    assert final["p_value"] == pytest.approx(2 / 2**10) and final["test"] == "exact McNemar"
    assert "final_lenient" in result["tests"]
    with pytest.raises(EvalSettingsError, match="share no problem"):
        compare_runs(str(tmp_path / "a"), _write_run(tmp_path / "c", [_record(0, [[True, True]], unique_id="x")]))


def test_leak_rate_and_leak_by_transition_in_the_summary_and_the_markdown():
    records = [_record(i, [c]) for i, c in enumerate([[False, True], [False, True], [True, True], [True, False]])]
    for record, leaks in zip(records, [[True], [False], [True], [False]], strict=True):
        record["samples"][0]["leak"] = leaks
    s = summarize(records, "feedback")
    assert s["leak_rate"] == 0.5 and len(s["ci95"]["leak_rate"]) == 3
    assert s["leak_by_transition"] == {"leak_checked": 4.0, "i2c": 0.5, "c2c": 1.0, "c2i": 0.0}
    text = summary_markdown(
        s, {"mode": "feedback", "ll": "a", "hl": "b", "data": "d", "rounds": 1, "samples": 1, "temperature": 0.0}
    )
    assert "| leak_rate | 0.5000 |" in text and "| feedbacks checked | i2c | c2c | c2i |" in text
    old = [_record(0, [[False, True]])]  # written before the leak check: no rate rather than a wrong one
    assert "leak_rate" not in summarize(old, "feedback")
    old[0]["samples"][0]["leak"] = [None]  # a task the check does not apply to
    assert "leak_rate" not in summarize(old, "feedback")
