"""Rule-based math grading: extract the final answer, then check it against the gold with math-verify.

math-verify's own timeouts are ``signal.alarm`` based: they only work in the main thread of a process and
raise ``ValueError`` anywhere else. :func:`score_math` therefore turns them on only in the main thread;
the wall-clock guarantee for batches comes from :class:`agent_system.rewards.pool.RewardPool`, which runs
this function in the main thread of worker processes and kills a worker that overruns.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

from math_verify import parse, verify
from math_verify.errors import TimeoutException
from math_verify.grader import is_assignment_relation, is_equation
from sympy import And, Eq
from sympy.core.function import AppliedUndef

from agent_system.rewards.math_answer import MAX_ANSWER_CHARS, extract_answer, normalize_answer

logger = logging.getLogger(__name__)
_BASE = re.compile(r"([0-9A-Za-z]+)_\{?(\d+)\}?")  # 40_9, 2516_{8}


def _alarm_seconds(timeout_s: float) -> int | None:
    """math-verify timeout argument: whole seconds in the main thread, disabled (None) elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return max(1, round(timeout_s))


def parse_answer(answer: str, timeout_s: float = 5.0) -> list:
    """Parses a bare answer (no delimiters) into math-verify's representation.

    Args:
        answer: A normalised answer such as ``\\frac{1}{2}``.
        timeout_s: Parse timeout in seconds (main thread only).

    Returns:
        math-verify's parse result; [] when unparsable or on timeout.
    """
    try:
        return parse("\\boxed{" + answer + "}", parsing_timeout=_alarm_seconds(timeout_s))
    except (Exception, TimeoutException) as exc:  # math-verify's timeout is a BaseException
        logger.debug("math-verify parse failed on %.80r: %s", answer, exc)
        return []


@functools.lru_cache(maxsize=200_000)
def parse_gold(gold: str, timeout_s: float = 5.0) -> tuple:
    """Parses a gold answer once per process (cached); the same gold is seen by every sample of a group.

    Args:
        gold: The gold answer, e.g. ``\\frac{1}{2}`` or ``72``.
        timeout_s: Parse timeout in seconds.

    Returns:
        A tuple of math-verify objects (empty when the gold cannot be parsed).
    """
    return tuple(parse_answer(normalize_answer(gold), timeout_s))


def answers_match(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Decides whether an extracted answer equals the gold answer.

    Args:
        pred: The extracted (raw) answer of the response.
        gold: The gold answer.
        timeout_s: math-verify parse and verify timeouts in seconds (main thread only).

    Returns:
        True when the normalised strings are equal or math-verify finds the expressions equivalent.
    """
    pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
    if pred_norm == gold_norm:
        return True
    return parsed_match(
        pred_norm, gold_norm, parse_gold(gold, timeout_s), parse_answer(pred_norm, timeout_s), timeout_s
    )


def other_base(pred_norm: str, gold_norm: str) -> bool:
    """Whether the answer is a number written in another base than the gold (math-verify drops ``_9`` from ``40_9``).

    Bare digits against ``40_9`` are read in the gold's base (the problem asked for it); ``40_8`` against ``40_9``,
    or ``40_9`` against the decimal gold ``40``, is another number.
    """
    pred_base = _BASE.fullmatch(pred_norm)
    if pred_base is None:
        return False
    gold_base = _BASE.fullmatch(gold_norm)
    return (gold_base.group(2) if gold_base else "10") != pred_base.group(2)


def parsed_match(
    pred_norm: str, gold_norm: str, gold_parsed: Sequence, pred_parsed: Sequence, timeout_s: float = 5.0
) -> bool:
    """The verdict of :func:`answers_match` on normalised answers that differ, already parsed.

    Args:
        pred_norm: The normalised extracted answer.
        gold_norm: The normalised gold answer.
        gold_parsed: :func:`parse_gold` of the gold answer.
        pred_parsed: :func:`parse_answer` of ``pred_norm``.
        timeout_s: math-verify's verify timeout in seconds (main thread only).

    Returns:
        True when math-verify finds the two equivalent, the answer is not in another base (:func:`other_base`), and
        an equation answer to a gold that is not an equation states a value (:func:`states_a_value`).
    """
    if not gold_parsed or not pred_parsed or other_base(pred_norm, gold_norm):
        return False
    if _unrelated_equation(gold_parsed, pred_parsed):
        return False
    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=_alarm_seconds(timeout_s)))
    except (Exception, TimeoutException) as exc:
        logger.debug("math-verify verify failed on %.80r: %s", pred_parsed[-1], exc)
        return False


def states_a_value(expr: Any) -> bool:
    """Whether an equation (or a chain ``x = 2 + 3 = 5``) names what its right side is the value of.

    Its left side is made of letters only (``x``, ``a_1``, ``a + b``, ``\\angle ABC``; math-verify's "assignment")
    or is a function value (``f(2)``, ``P(x)``). ``5x - 7y + 11z + 4 = 0`` or ``2x = 10`` does not: its right side
    is not the answer, so it does not count against the gold ``0`` or ``10``.
    """
    if is_assignment_relation(expr):
        return True
    first = expr.args[0] if isinstance(expr, And) else expr
    return isinstance(first, Eq) and isinstance(first.lhs, AppliedUndef)


def _unrelated_equation(gold_parsed: Sequence, pred_parsed: Sequence) -> bool:
    """An equation answer against a gold that is not an equation, whose right side would be compared although the
    equation does not state a value (math-verify compares right sides whatever the left side is)."""
    gold = next((item for item in gold_parsed if not isinstance(item, str)), None)
    pred = next((item for item in pred_parsed if not isinstance(item, str)), None)
    if gold is None or pred is None or is_equation(gold) or not is_equation(pred):
        return False
    return not states_a_value(pred)


def score_math(
    solution_str: str,
    ground_truth: str,
    allow_last_number: bool = False,
    timeout_s: float = 5.0,
    judge: Any = None,
    problem: str = "",
) -> dict:
    """Scores one math response.

    Args:
        solution_str: The model response.
        ground_truth: The gold final answer (already extracted, e.g. MATH's boxed answer or GSM8K's N).
        allow_last_number: Fall back to the last number of the response (GSM8K and the arithmetic set).
        timeout_s: math-verify timeouts in seconds.
        judge: Optional :class:`agent_system.rewards.judge.JudgeConfig`; consulted only when the rule
            verdict is negative and an answer was extracted; any judge failure keeps the rule verdict.
        problem: The problem text, passed to the judge.

    Returns:
        ``{"score", "acc", "pred", "error"}``; ``error`` is None or a short reason.
    """
    pred = extract_answer(solution_str or "", allow_last_number=allow_last_number)
    if pred is None:
        return {"score": 0.0, "acc": False, "pred": "", "error": "no answer found"}
    if len(pred) > MAX_ANSWER_CHARS:
        return {"score": 0.0, "acc": False, "pred": pred[:100], "error": "answer too long"}
    acc = answers_match(pred, str(ground_truth), timeout_s)
    error = None
    if not acc and judge is not None:
        from agent_system.rewards.judge import judge_equivalence

        verdict = judge_equivalence(problem, str(ground_truth), pred, judge)
        if verdict is None:
            error = "judge unavailable; rule verdict kept"
        else:
            acc = verdict
    return {"score": float(acc), "acc": acc, "pred": pred, "error": error}
