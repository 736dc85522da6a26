"""Grader defects found on MATH-500 (issue 22): each case failed before its fix (real math-verify)."""

import pytest

from agent_system.rewards.math_reward import score_math

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
