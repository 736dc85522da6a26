"""Answer extraction and math-verify grading on the usual MATH / GSM8K answer forms (real math-verify)."""

import pytest

from agent_system.rewards import compute_score
from agent_system.rewards.math_answer import extract_answer, gsm8k_gold, last_boxed_content, normalize_answer
from agent_system.rewards.math_reward import answers_match, score_math


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then: \\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
        ("nested \\boxed{\\text{(C)}}", "\\text{(C)}"),
        ("\\fbox{42}", "42"),
        ("The answer is \\boxed 5 apples", "5"),
        ("first \\boxed{7} then broken \\boxed{8", "7"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    ("text", "last_number", "expected"),
    [
        ("She pays 3*4=12 dollars.\n#### 12", False, "12"),
        ("Thus...\nThe answer is $\\frac{3}{4}$.", False, "\\frac{3}{4}"),
        ("Final answer: **17**", False, "17"),
        ("The answer is $\\$32,\\!348$.", False, "\\$32,\\!348"),
        ("The final answer is 2,500.", False, "2,500"),
        ("7 + 5 = 12", True, "12"),
        ("7 + 5 = 12", False, None),
        ("no numbers here", True, None),
        ("", True, None),
    ],
)
def test_extract_answer_fallbacks(text, last_number, expected):
    assert extract_answer(text, allow_last_number=last_number) == expected


def test_gsm8k_gold_and_normalize():
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072") == "1072"
    assert gsm8k_gold("no final line") is None
    assert normalize_answer("10\\%") == "10"
    assert normalize_answer("1{,}000") == "1,000"


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac{14}{3}", "4\\frac{2}{3}"),
        ("\\frac{14}{3}", "\\dfrac{14}{3}"),
        ("0.25", "\\frac14"),
        ("10", "10\\%"),
        ("10\\%", "10"),
        ("[2,5)", "[2, 5)"),
        ("(-\\infty,3]", "(-\\infty, 3]"),
        ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("x=3", "3"),
        ("C", "\\text{(C)}"),
        ("5\\text{ cm}", "5"),
        ("30^\\circ", "30"),
        ("1,000", "1000"),
        ("-7", "-7"),
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("2\\pi", "2 \\pi"),
        ("\\$18.90", "18.90"),
        ("3, 2, 1", "1,2,3"),
    ],
)
def test_equivalent_forms_match(pred, gold):
    assert answers_match(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [("0.49", "\\frac{1}{2}"), ("4", "3"), ("-7", "7"), ("[2,5]", "[2,5)"), ("\\sqrt{3}", "3"), ("\\pi", "3.14")],
)
def test_different_answers_do_not_match(pred, gold):
    assert not answers_match(pred, gold)


def test_score_math_result_shape_and_guards():
    assert score_math("\\boxed{12}", "12") == {"score": 1.0, "acc": True, "pred": "12", "error": None}
    assert score_math("I do not know", "12")["error"] == "no answer found"
    huge = score_math("\\boxed{" + "1" * 5000 + "}", "1")
    assert huge["score"] == 0.0 and huge["error"] == "answer too long"


@pytest.mark.parametrize(
    ("source", "response", "gold", "acc"),
    [
        ("math", "Thus $x = \\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}", True),
        ("math500", "\\boxed{0.5}", "\\frac12", True),
        ("math_500", "\\boxed{3}", "4", False),
        ("HuggingFaceH4/MATH-500", "\\boxed{\\text{(B)}}", "\\text{(B)}", True),
        ("gsm8k", "3 + 4 = 7 apples.\n#### 7", "7", True),
        ("openai/gsm8k", "so she has 1,234 left", "#### 1,234", True),
        ("arith", "7 + 5 = 12", "12", True),
        ("arith", "\\boxed{\\frac{5}{6}}", "\\frac{5}{6}", True),
    ],
)
def test_compute_score_math_sources(source, response, gold, acc):
    result = compute_score(source, response, gold)
    assert result["acc"] is acc and result["score"] == float(acc)
    assert set(result) == {"score", "acc", "pred", "error", "pass_rate", "first_failure"}


def test_compute_score_rejects_unknown_source():
    with pytest.raises(ValueError, match="unknown data_source"):
        compute_score("nope", "\\boxed{1}", "1")
