"""The MATH-500 evaluator's metrics, argument checks and resumable record store (no models)."""

from __future__ import annotations

import argparse
import json

import pytest

from agent_system.eval.math500 import EvalSettingsError, RecordStore, summarize, validate


def _record(index: int, samples: list[list[bool]], mode: str = "feedback") -> dict:
    per_turn = 2 if mode == "feedback" else 1
    out = []
    for correct in samples:
        count = 1 + per_turn * (len(correct) - 1)
        out.append({"turns": ["x"] * count, "truncated": [False] * count, "correct": correct})
    return {"index": index, "problem": f"p{index}", "ground_truth": "1", "samples": out}


def test_feedback_metrics_count_transitions_and_the_oracle():
    records = [
        _record(0, [[False, True]]),  # wrong → right: i→c
        _record(1, [[True, False]]),  # right → wrong: c→i
        _record(2, [[True, True]]),
        _record(3, [[False, False]]),
    ]
    s = summarize(records, "feedback")
    assert (s["acc@t1"], s["acc@t3"], s["final_acc"]) == (0.5, 0.5, 0.5)
    assert (s["i_to_c"], s["c_to_i"], s["delta_t1_final"]) == (0.25, 0.25, 0.0)
    assert s["solved_any_turn"] == 0.75  # the oracle counts problem 1, the final answer does not
    assert "pass@1_t1" not in s


def test_turn_numbers_follow_the_mode_and_rounds():
    two_rounds = [_record(0, [[False, False, True]])]
    assert {"acc@t1", "acc@t3", "acc@t5"} <= summarize(two_rounds, "feedback").keys()
    self_correct = [_record(0, [[False, False, True]], "self_correct")]
    s = summarize(self_correct, "self_correct")
    assert {"acc@t1", "acc@t2", "acc@t3"} <= s.keys() and s["final_acc"] == 1.0 and "truncated_feedback" not in s


def test_pass_at_k_counts_a_problem_once_when_any_sample_is_right():
    records = [_record(0, [[False, False], [False, True]]), _record(1, [[False, False], [False, False]])]
    s = summarize(records, "feedback")
    assert s["samples_per_problem"] == 2
    assert s["pass@2_t1"] == 0.0 and s["pass@2_final"] == 0.5 and s["pass@2_any_turn"] == 0.5
    assert s["final_acc"] == 0.25  # pass@1 is the mean over samples


def _args(**kw) -> argparse.Namespace:
    base = {"hl": None, "self_correct": False, "rounds": None, "samples": 1, "temperature": 0.0}
    return argparse.Namespace(**{**base, **kw})


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


def test_store_resumes_drops_a_cut_line_and_refuses_other_settings(tmp_path):
    settings = {"ll": "a", "hl": "b", "mode": "feedback", "rounds": 1}
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
