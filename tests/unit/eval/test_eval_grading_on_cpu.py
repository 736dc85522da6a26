"""The evaluator's grading: outcomes from the real grader's results, the lenient column with real math-verify in
killable workers, and a named judge (a real local HTTP server) that gets the problem text and is a column of its own."""

from __future__ import annotations

import argparse

import pytest
from chat_server import Request, chat_reply, chat_server

from agent_system.eval.grading import LenientGrader, outcome
from agent_system.eval.math500 import grade
from agent_system.multi_turn_rollout.episode import Turn
from agent_system.rewards import RewardPool
from agent_system.rewards.judge import JudgeConfig

pytestmark = pytest.mark.external  # reward pools (worker processes)

# a response math-verify cannot finish verifying (until its own alarm, >= 1 s): hostile input to the lenient grader
SLOW_TO_VERIFY = "so the answer is $9^{9^{9^{9}}}$"


@pytest.fixture
def pool():
    with RewardPool(num_workers=1, timeout_s=10.0) as reward_pool:
        yield reward_pool


@pytest.fixture
def lenient():
    with LenientGrader(workers=1, timeout_s=1.0) as grader:
        yield grader


def test_outcomes_of_the_real_graders_results(pool):
    responses = ["so \\boxed{12}", "so \\boxed{13}", "I think it is twelve", "\\boxed{" + "1+" * 600 + "1}"]
    items = [{"data_source": "math500", "solution_str": r, "ground_truth": "12", "extra_info": {}} for r in responses]
    results = pool.score(items)
    assert [outcome(r, truncated=False) for r in results] == ["correct", "wrong", "no_answer", "wrong"]
    # a turn cut at its token budget: truncated unless its answer is right anyway
    assert [outcome(r, truncated=True) for r in results] == ["correct", "truncated", "truncated", "truncated"]
    # the pool's results for an overrun and a crashed worker (RewardPool.score's docstring)
    assert outcome({"score": 0.0, "acc": False, "pred": "", "error": "timeout"}, False) == "timeout"
    assert outcome({"score": 0.0, "acc": False, "pred": "", "error": "worker crashed"}, False) == "error"


def test_lenient_counts_an_unboxed_final_answer(lenient):
    pairs = [("So x = 5", "5"), ("so \\boxed{2}", "3"), ("Thus $\\frac{2}{4}$", "\\frac{1}{2}"), ("no maths", "1")]
    results = lenient.grade(pairs)
    assert [r["lenient"] for r in results] == [True, False, True, False]
    assert [r["lenient_answer"] for r in results] == ["5", "2", "\\frac{2}{4}", ""]
    assert all(r["lenient_error"] is None for r in results)


def test_lenient_grader_kills_a_worker_stuck_on_a_response():
    """The worker's wall-clock limit (0.5 s) fires before math-verify's own alarm (1 s): killed, replaced, counted."""
    with LenientGrader(workers=1, timeout_s=0.5) as grader:
        results = grader.grade([(SLOW_TO_VERIFY, "1"), ("so \\boxed{2}", "2")])
    assert results[0] == {"lenient": False, "lenient_answer": "", "lenient_error": "timeout"}
    assert results[1]["lenient"] is True  # the replacement worker grades the next pair


JUDGED: list[Request] = []


@pytest.fixture(scope="module")
def judge_url():
    with chat_server(lambda request: (200, chat_reply("YES")), JUDGED) as url:
        yield url


def _turn(text: str, truncated: bool = False) -> Turn:
    return Turn(prompt=None, response_ids=[], log_probs=[], text=text, truncated=truncated)


def _row(question: str, gold: str, subject: str) -> dict:
    extra = {"question": question, "subject": subject, "level": "3", "unique_id": f"test/{subject}/1.json"}
    return {
        "data_source": "math500",
        "prompt": [{"role": "user", "content": f"Solve: {question}"}],
        "reward_model": {"ground_truth": gold},
        "extra_info": extra,
    }


def test_records_keep_answers_outcomes_lenient_and_the_judge_with_the_problem_text(pool, lenient, judge_url):
    rows = [_row("What is 6 + 6?", "12", "Algebra"), _row("Half of one?", "\\frac{1}{2}", "Prealgebra")]
    turns = [
        [_turn("\\boxed{13}"), _turn("feedback"), _turn("So it is 12")],
        [_turn("one half, \\boxed{0.5}"), _turn("feedback"), _turn("\\boxed{a half", truncated=True)],
    ]
    args = argparse.Namespace(mode="feedback", samples=1, judge_config=None)
    plain = grade(pool, lenient, rows, [0, 1], turns, args)
    first = plain[0]["samples"][0]
    assert first["answer"] == ["13", ""] and first["outcome"] == ["wrong", "no_answer"]
    assert first["lenient"] == [False, True] and first["lenient_answer"][1] == "12" and "judge" not in first
    assert plain[1]["samples"][0]["outcome"] == ["correct", "truncated"]
    assert (plain[0]["subject"], plain[0]["level"], plain[0]["unique_id"]) == ("Algebra", "3", "test/Algebra/1.json")

    asked = len(JUDGED)
    args.judge_config = JudgeConfig(judge_url, "judge", timeout_s=5)
    judged = grade(pool, lenient, rows, [0, 1], turns, args)
    assert judged[0]["samples"][0]["judge"] == ["yes", "not_asked"]  # only the rule-wrong answer that exists
    assert judged[0]["samples"][0]["correct"] == [False, False]  # the rule column is not changed by the judge
    assert judged[1]["samples"][0]["judge"] == ["not_asked", "not_asked"]
    assert len(JUDGED) == asked + 1 and "What is 6 + 6?" in JUDGED[-1].user  # the problem text, not ""


def test_records_keep_whether_each_feedback_states_the_answer(pool, lenient):
    """With an HL, each feedback turn of every round is checked (agent_system.rewards.leak); a solver alone has none."""
    rows = [_row("What is 6 + 6?", "12", "Algebra"), _row("Half of one?", "\\frac{1}{2}", "Prealgebra")]
    turns = [
        [_turn("\\boxed{13}"), _turn("Recheck: the answer is 12."), _turn("\\boxed{12}")]
        + [_turn("The answer is not 13."), _turn("\\boxed{12}")],
        [_turn("\\boxed{2}"), _turn("Halve it: 1 / 2 = 0.5"), _turn("\\boxed{0.5}")]
        + [_turn("You wrote 2 first; check the halving step."), _turn("\\boxed{0.5}")],
    ]
    args = argparse.Namespace(mode="feedback", samples=1, judge_config=None)
    records = grade(pool, lenient, rows, [0, 1], turns, args)
    assert [r["samples"][0]["leak"] for r in records] == [[True, False], [True, False]]
    alone = grade(
        pool,
        lenient,
        rows,
        [0],
        [[_turn("\\boxed{12}")]],
        argparse.Namespace(mode="single", samples=1, judge_config=None),
    )
    assert "leak" not in alone[0]["samples"][0]
