"""Grader defects found on MATH-500 (issue 22): each case failed before its fix (real math-verify)."""

import pytest

from agent_system.rewards.math_reward import answers_match, score_math

# MATH-500 test/number_theory/417: thin spaces with a space after them inside one number
GOLD_417 = "11,\\! 111,\\! 111,\\! 100"


@pytest.mark.parametrize(
    "response", ["\\boxed{11111111100}", "\\boxed{11,111,111,100}", "\\boxed{11,\\! 111,\\! 111,\\! 100}"]
)
def test_thin_space_thousands_gold_is_one_number(response):
    assert score_math(response, GOLD_417)["acc"]


@pytest.mark.parametrize("response", ["\\boxed{100, 111, 11}", "\\boxed{11, 111, 111, 100}", "\\boxed{111}"])
def test_thin_space_thousands_gold_is_not_a_set(response):
    assert not score_math(response, GOLD_417)["acc"]


@pytest.mark.parametrize(
    ("response", "gold"),
    [("so it is \\boxed 6.", "6"), ("\\boxed 6, done", "6"), ("\\boxed 2.5.", "2.5"), ("\\boxed 5! ways", "120")],
)
def test_braceless_box_drops_the_sentence_end(response, gold):
    assert score_math(response, gold)["acc"]


@pytest.mark.parametrize("response", ["\\boxed 7.", "\\boxed .", "\\boxed 6.5."])
def test_braceless_box_sentence_end_does_not_make_wrong_answers_right(response):
    assert not score_math(response, "6")["acc"]


@pytest.mark.parametrize(
    ("pred", "gold", "counts"),
    [
        ("40_8", "40_9", False),  # math-verify reads both as 40: found by the all-golds cross check
        ("40_9", "40", False),  # 40 in base 9 is 36
        ("2516_9", "2516_8", False),
        ("40_9", "40_9", True),
        ("40_{9}", "40_9", True),
        ("40", "40_9", True),  # the digits, in the base the problem asked for
        ("36", "40_9", False),
    ],
)
def test_a_number_in_another_base_is_another_number(pred, gold, counts):
    assert answers_match(pred, gold) is counts
