"""All-golds checks of the math grader (issue 22, item 6) on the shared MATH-500 and GSM8K test files, real math-verify.

Self check: every gold, written as a model writes it (boxed in a sentence, a brace-less ``\\boxed 6.``, thousands
separators, ``\\dfrac``), scores 1. Cross check here: the golds that are hazards for a grader (thousands written with
thin spaces, equations, the values their parts would collapse to) against each other; the whole 500 x 500 and
1,319 x 1,319 cross check is ``tests/integration/test_math_golds_cross_check_on_cpu.py`` (slow). Also the decided
equation convention (docs/GRADER.md).
"""

import pytest
from shared_data import shared_data

from agent_system.rewards.gold_sweep import Gold, cross_check, load_golds, model_renderings, self_check
from agent_system.rewards.math_reward import answers_match


@pytest.mark.external
def test_every_gold_scores_one_against_itself_as_a_model_writes_it():
    golds = load_golds(str(shared_data()))
    assert [g.source for g in golds].count("math500") == 500 and [g.source for g in golds].count("gsm8k") == 1319
    result = self_check(golds)
    assert result.failures == []
    assert result.graded > 2 * len(golds)  # several forms per gold (3,689 on the shared files)


def test_renderings_are_the_forms_models_write():
    forms = model_renderings("11,\\! 111,\\! 111,\\! 100")
    assert "The final answer is $\\boxed{11111111100}$." in forms
    assert "The final answer is $\\boxed{11,111,111,100}$." in forms
    assert "so it is \\boxed 11111111100." in forms
    assert "The final answer is $\\boxed{\\dfrac{3}{4}}$." in model_renderings("\\frac{3}{4}")
    assert "so it is \\boxed 6." in model_renderings("6")


# MATH-500 golds (and the values a wrong reading of them collapses to), as distinct problems' golds
HAZARDS = [
    "11,\\! 111,\\! 111,\\! 100",  # test/number_theory/417
    "100",
    "11",
    "111",
    "0",
    "5x - 7y + 11z + 4 = 0",  # an equation whose right side is another problem's gold
    "x=5",
    "5",
    "y = 2x + 3",
    "3",
    "10\\%",
    "10",
]


def test_hazard_golds_match_no_other_gold_but_the_equivalent_ones():
    result = cross_check([Gold(str(i), "math500", gold) for i, gold in enumerate(HAZARDS)], workers=1)
    assert result.distinct == {"math500": 11}  # 10\% and 10 are one answer (MATH grades percent signs away)
    assert result.pairs == 11 * 10
    # "x=5" states the value 5 (an assignment): the same answer as 5
    assert sorted((pred, gold) for _, pred, gold in result.matches) == [("5", "x=5"), ("x=5", "5")]


@pytest.mark.parametrize(
    ("pred", "gold", "counts"),
    [
        ("5x - 7y + 11z + 4 = 0", "0", False),  # counted before: math-verify compares right sides of any equation
        ("2x = 10", "10", False),
        ("x^2 = 4", "4", False),
        ("x = 5", "5", True),
        ("x = 2 + 3 = 5", "5", True),
        ("a + b = 14", "14", True),
        ("f(2) = 5", "5", True),
        ("P(x) = x^2 + 1", "x^2 + 1", True),
        ("5", "x = 5", True),  # the gold is an equation: it decides
        ("y = 2x + 3", "y = 2x + 3", True),
        ("2x + 3", "y = 2x + 3", True),
        ("y = 5", "x = 5", False),
    ],
)
def test_an_equation_counts_against_a_value_only_when_it_states_that_value(pred, gold, counts):
    assert answers_match(pred, gold) is counts
