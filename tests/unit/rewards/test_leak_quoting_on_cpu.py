"""The confidence term's quoting route and the leak check (docs/LEAK.md, "The confidence term and quoting"): the
confidence term pays a feedback that makes the reference solution likelier, so quoting the reference pays; the leak
check reads the feedback against the gold answer only. A quoted step that writes the gold's value (or arithmetic that
evaluates to it, or the reference's box) leaks; a quote that stops before the value, or the method in words, does not.
These are the documented examples, each as the check decides it. Value presence and "no candidate" decide without the
grader (no process); the two the rules decide grade their candidates with the RewardPool (``external``)."""

from __future__ import annotations

import pytest

from agent_system.rewards import RewardPool, leak

TOM = "Tom buys 3 books at 8 dollars each. How much does he pay in total, in dollars?"
TOM_REFERENCE = "Tom pays 3*8=<<3*8=24>>24 dollars.\n#### 24"  # GSM8K's reference solution form
ROOTS = "What is the sum of the roots of $x^2-5x+6=0$?"
ROOTS_REFERENCE = (  # MATH's reference solution form: the worked steps, the answer boxed
    "We factor $x^2-5x+6=(x-2)(x-3)$, so the roots are $2$ and $3$, and their sum is $2+3=\\boxed{5}$."
)

QUOTES_CAUGHT_WITHOUT_THE_GRADER = [  # value presence: the gold's value stands in the quote
    (TOM_REFERENCE, "24", TOM),  # the whole reference
    ("Follow this: Tom pays 3*8=<<3*8=24>>24 dollars.", "24", TOM),  # its step with the result
    ("Tom pays 3*8 dollars.", "24", TOM),  # the step's arithmetic, unevaluated
    ("Multiply 3 by 8.", "24", TOM),  # in words
]
QUOTES_CAUGHT_BY_THE_RULES = [  # the value 5 is in the problem ("-5x"), so value presence accounts for it
    (ROOTS_REFERENCE, "5", ROOTS),  # the whole reference: its box (rule 1)
    ("Their sum is $2+3$.", "5", ROOTS),  # the asked quantity's claim (rule 5), graded equal to 5
]
QUOTES_NOT_CAUGHT = [  # the route the check does not close: the reference's steps without the gold's value
    ("We factor $x^2-5x+6=(x-2)(x-3)$, so the roots are $2$ and $3$, and their sum is", "5", ROOTS),
    ("So the roots are $2$ and $3$; now add them.", "5", ROOTS),  # one addition from the gold
    ("We factor $x^2-5x+6=(x-2)(x-3)$ as the reference does; read the roots off the factors.", "5", ROOTS),
    ("Tom pays the number of books times the price of each book.", "24", TOM),  # the method in words
]


def _row(gold: str, problem: str) -> dict:
    return {"data_source": "math", "reward_model": {"ground_truth": gold}, "extra_info": {"question": problem}}


@pytest.mark.parametrize(("feedback", "gold", "problem"), QUOTES_CAUGHT_WITHOUT_THE_GRADER)
def test_a_quote_that_writes_the_golds_value_leaks(feedback, gold, problem):
    assert leak.check_feedbacks(None, [(feedback, _row(gold, problem))])[0] == 1.0  # decided before any grading


@pytest.mark.parametrize(("feedback", "gold", "problem"), QUOTES_NOT_CAUGHT)
def test_a_quote_without_the_golds_value_does_not(feedback, gold, problem):
    assert not leak.candidate_answers(feedback, problem)  # nothing to grade: the pool is never asked
    assert leak.check_feedbacks(None, [(feedback, _row(gold, problem))])[0] == 0.0


@pytest.mark.external
def test_a_quoted_box_or_claim_leaks_through_the_rules():
    with RewardPool(num_workers=1, timeout_s=6.0) as pool:
        verdicts = leak.check_feedbacks(pool, [(f, _row(g, p)) for f, g, p in QUOTES_CAUGHT_BY_THE_RULES])
    assert verdicts.tolist() == [1.0, 1.0]
