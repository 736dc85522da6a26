"""MBPP tasks whose tests cannot tell a constant from a solution: every assert expects the same value.

``assert f(a) == 2``, ``assert f(b) == 2``, ``assert f(c) == 2``: a program ``def f(*args): return 2`` passes all
three without solving anything, so such a task rewards a policy for guessing the constant. Read from the asserts
(never from a list of ids): an assert expects a value when it is ``<call> == <literal>`` (either side), ``<call> is
<literal>``, a bare ``<call>`` (truthy: ``True`` passes it) or ``not <call>`` (``False`` passes it). In MBPP's 974
tasks these are tasks 37, 203, 339, 667, 674, 816 and 899; the preparation drops them from the training split
(:func:`agent_system.data.prepare.build_all`).
"""

from __future__ import annotations

import ast
import json

_TRUTHY, _FALSY = (bool, True), (bool, False)


def _literal(node: ast.expr) -> tuple[type, object] | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return type(value), value


def expected_value(test: str) -> tuple[type, object] | None:
    """The one value a constant must equal to pass the assert ``test`` (its type and value), or None when the assert
    is of another form (several comparisons, no literal side, not an assert)."""
    try:
        body = ast.parse(test.strip()).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    check = body[0].test
    if isinstance(check, ast.Call):
        return _TRUTHY
    if isinstance(check, ast.UnaryOp) and isinstance(check.op, ast.Not) and isinstance(check.operand, ast.Call):
        return _FALSY
    if not (isinstance(check, ast.Compare) and len(check.ops) == 1 and isinstance(check.ops[0], ast.Eq | ast.Is)):
        return None
    left, right = _literal(check.left), _literal(check.comparators[0])
    if (left is None) == (right is None):  # no literal side, or two (a test of nothing)
        return None
    return left or right


def constant_answer(tests: list[str]) -> str | None:
    """The constant that passes every test (its ``repr``), or None when the tests tell a constant from a solution.

    Values are compared with their type, so ``== 1`` and ``== True`` are two answers.
    """
    expected = [expected_value(test) for test in tests]
    if not expected or any(value is None for value in expected):
        return None
    first = expected[0]
    if any(value[0] is not first[0] or value[1] != first[1] for value in expected[1:]):
        return None
    return repr(first[1])


def constant_answer_tasks(rows: list[dict]) -> dict[int, str]:
    """``{task_id: the constant}`` of the code rows (MBPP) whose tests a constant passes."""
    found = {}
    for row in rows:
        constant = constant_answer(json.loads(row["reward_model"]["ground_truth"]))
        if constant is not None:
            found[int(row["extra_info"]["task_id"])] = constant
    return found
