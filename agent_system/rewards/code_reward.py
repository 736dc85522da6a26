"""Code reward (MBPP-style): extract the program from a response and run the task's asserts in the sandbox."""

from __future__ import annotations

import json
import logging
import re

from agent_system.rewards.code_sandbox import SandboxLimits, SandboxResult, printable, run_tests

logger = logging.getLogger(__name__)

_TAG_RE = re.compile(r"[A-Za-z0-9_+-]*")
_PYTHON_TAGS = {"", "python", "py", "python3"}


def fenced_blocks(response: str) -> list[tuple[str, str]]:
    """The ``(tag, body)`` of each fenced block: a fence opens at three backticks followed by a line break (the
    tag is what follows the backticks on that line, up to its first character outside ``[A-Za-z0-9_+-]``) and closes
    at the next three backticks or at the end. One pass over the text: a response of backticks alone took the regex
    this replaces quadratic time (83 s for 200,000 characters)."""
    blocks, position = [], 0
    while (start := response.find("```", position)) != -1:
        newline = response.find("\n", start + 3)
        if newline == -1:  # no line break after any later fence either
            break
        close = response.find("```", newline + 1)
        end = len(response) if close == -1 else close
        blocks.append((_TAG_RE.match(response, start + 3, newline).group(), response[newline + 1 : end]))
        position = end + 3
    return blocks


UNVERIFIABLE = "unverifiable result"  # the program's side of an assert was not plain data (scored as a failure)
GRADER_FAILED = "the grader failed on this program"  # an exception in the grader itself (logged; scored 0)


def extract_code(response: str, entry_point: str | None = None) -> str:
    """Extracts the program from a model response.

    Fenced blocks tagged python (or untagged) are preferred: the last one that defines ``entry_point``
    (or any function when the name is unknown), else the last python block. A response without fences
    is taken as bare code.

    Args:
        response: The model response.
        entry_point: The function the tests call, when known.

    Returns:
        The program text (possibly empty).
    """
    blocks = [body for tag, body in fenced_blocks(response) if tag.lower() in _PYTHON_TAGS]
    if not blocks:
        return response.strip().strip("`")
    wanted = f"def {entry_point}" if entry_point else "def "
    defining = [b for b in blocks if wanted in b]
    return (defining or blocks)[-1]


def parse_tests(ground_truth: str | list) -> list[str]:
    """Accepts the assert list as a list or as its JSON string."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ValueError("code ground_truth must be a list of test statements (or its JSON string)")
    return [str(t) for t in tests]


def _run_tests(code: str, tests: list[str], setup_code: str, limits: SandboxLimits | None) -> SandboxResult:
    """:func:`run_tests`, where an exception of the grader itself (a defect a program found) fails every test."""
    try:
        return run_tests(code, tests, setup_code, limits)
    except Exception as exc:
        logger.warning("code reward: the grader failed on a program; it scores 0", exc_info=True)
        message = f"{GRADER_FAILED} ({type(exc).__name__}: {str(exc)[:300]})"
        return SandboxResult([False] * len(tests), printable(message), GRADER_FAILED, 0.0, ["not run"] * len(tests),
                             [False] * len(tests))  # fmt: skip


def score_code(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict | None = None,
    limits: SandboxLimits | None = None,
) -> dict:
    """Scores a code response against its tests.

    The ``score`` is binary all-tests-pass (the RL reward); the pass fraction is in ``pass_rate``.
    Set ``extra_info["code_reward"] = "pass_rate"`` to use the fraction as ``score`` instead.

    Args:
        solution_str: The model response (fenced python block or bare code).
        ground_truth: The assert statements, a list or its JSON string.
        extra_info: May hold ``test_setup_code``, ``entry_point`` and ``code_reward``.
        limits: Sandbox limits (default :class:`SandboxLimits`).

    Returns:
        ``{"score", "acc", "pred", "error", "pass_rate", "first_failure"}``; ``error`` is the run-level problem
        (``"program error"``, ``"timeout"``, ``"time limit exceeded"``, ``"exited early"``, :data:`GRADER_FAILED`),
        else ``"unverifiable result"`` when the program's side of an assert was not plain data (docs/CODE_REWARD.md),
        else None.
    """
    extra_info = extra_info or {}
    tests = parse_tests(ground_truth)
    code = extract_code(solution_str or "", extra_info.get("entry_point"))
    if not code.strip():
        return {
            "score": 0.0,
            "acc": False,
            "pred": "",
            "error": "no code found",
            "pass_rate": 0.0,
            "first_failure": "no code found in the response",
        }
    result = _run_tests(code, tests, extra_info.get("test_setup_code") or "", limits)
    use_fraction = extra_info.get("code_reward") == "pass_rate"
    unverifiable = UNVERIFIABLE if UNVERIFIABLE in result.outcomes else None
    return {
        "score": result.pass_rate if use_fraction else float(result.all_passed),
        "acc": result.all_passed,
        "pred": code,
        "error": result.error or unverifiable,
        "pass_rate": result.pass_rate,
        "first_failure": result.first_failure or "",
    }


FEEDBACK_TESTS = ("shown", "all")  # mlmt.code_feedback_tests: which tests the feedback writer reads the results of


def shown_tests(tests: list[str], statement: str) -> list[str]:
    """The tests whose text the problem statement shows (an MBPP row shows its first assert); the others are hidden."""
    return [test for test in tests if test.strip() and test.strip() in statement]


def execution_result(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict | None = None,
    limits: SandboxLimits | None = None,
    tests: str = "shown",
    statement: str | None = None,
) -> str:
    """What a code reviewer (the HL) reads about a response: the response run against the task's tests.

    Args:
        solution_str: The model response.
        ground_truth: The assert statements, a list or its JSON string.
        extra_info: As for :func:`score_code`; ``question`` is the problem statement when ``statement`` is None.
        limits: Sandbox limits (default :class:`SandboxLimits`).
        tests: ``"shown"`` (default): only the tests the problem statement shows are run and reported, so the
            reader never sees a hidden test or its expected value. ``"all"``: every test, and the first failing one
            with its expected value, as the original did. This leaks the hidden tests (the ground truth) to the
            feedback writer (``mlmt.code_feedback_tests=all``).
        statement: The problem statement the solver read (default ``extra_info["question"]``).

    Returns:
        ``"All 3 tests passed."``, or ``"1 of 3 tests passed. First failure: <the failing assert or the error>"``;
        with ``tests="shown"``, ``"... tests shown in the task ..."`` and, when the task shows none, whether the
        program runs.
    """
    if tests not in FEEDBACK_TESTS:
        raise ValueError(f"tests={tests!r}: choose one of {FEEDBACK_TESTS}")
    every = parse_tests(ground_truth)
    if tests == "all":
        count, result = len(every), score_code(solution_str, every, extra_info, limits)
        if result["acc"]:
            return f"All {count} tests passed."
        passed = round(result["pass_rate"] * count)
        return f"{passed} of {count} tests passed. First failure: {result['first_failure'] or result['error']}"
    extra_info = extra_info or {}
    text = statement if statement is not None else str(extra_info.get("question") or "")
    shown = shown_tests(every, text)
    code = extract_code(solution_str or "", extra_info.get("entry_point"))
    if not code.strip():
        return f"0 of {len(shown)} tests shown in the task passed. First failure: no code found in the response"
    result = _run_tests(code, shown, extra_info.get("test_setup_code") or "", limits)
    if not shown:
        if result.error:
            return f"The task shows no test. The program failed to run: {result.first_failure or result.error}"
        return "The task shows no test. The program runs without error."
    if result.all_passed:
        return f"All {len(shown)} tests shown in the task passed."
    passed = sum(result.passed)
    failure = result.first_failure or result.error
    return f"{passed} of {len(shown)} tests shown in the task passed. First failure: {failure}"
