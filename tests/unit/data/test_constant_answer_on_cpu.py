"""MBPP tasks whose tests a constant passes (issue 45, point 4), read from the asserts: on synthetic asserts of each
form, and on the real MBPP, where the detector finds exactly tasks 37, 203, 339, 667, 674, 816 and 899.

    .venv/bin/python -m pytest -q tests/unit/data/test_constant_answer_on_cpu.py
"""

from __future__ import annotations

import json

import pytest
from shared_data import shared_data

from agent_system.data.constant_answer import constant_answer, expected_value


@pytest.mark.parametrize(
    ("tests", "constant"),
    [
        (["assert f(1) == 2", "assert f(2) == 2", "assert f(3)==2"], "2"),
        (["assert 2 == f(1)", "assert f(2) == (2)", "assert f(3) is 2"], "2"),  # the literal on either side
        (["assert f([1, 2]) == ()", "assert f((3,)) == ()"], "()"),
        (["assert f(1)", "assert f(2) == True", "assert f(3) is True"], "True"),  # a bare call: True passes it
        (["assert not f(1)", "assert f(2) == False"], "False"),
        (["assert f(1) == 2", "assert f(2) == 3"], None),  # a solution is needed
        (["assert f(1) == 1", "assert f(2) == True"], None),  # 1 == True, but they are two answers
        (["assert f(1) == 2", "assert f(2) == 2.5"], None),
        (["assert f(1) == g(1)", "assert f(2) == g(2)"], None),  # no literal side
        (["assert f(1) == 2", "assert math.isclose(f(2), 2)"], None),  # a form the detector does not read
        (["assert f(1) == 2", "x = f(2)"], None),
        (["assert f(1) == 2", "assert ((("], None),  # unparsable
        ([], None),
    ],
)
def test_constant_answer_of_each_assert_form(tests, constant):
    assert constant_answer(tests) == constant


def test_an_assert_of_two_literals_or_a_chain_expects_no_value():
    assert expected_value("assert 1 == 1") is None
    assert expected_value("assert 1 < f(1) == 2") is None


@pytest.mark.external
def test_the_real_mbpp_has_exactly_seven_constant_answer_tasks():
    rows = [json.loads(line) for line in shared_data("mbpp", "mbpp.jsonl").read_text().splitlines() if line.strip()]
    found = {row["task_id"]: constant_answer(row["test_list"]) for row in rows}
    found = {task: constant for task, constant in found.items() if constant is not None}
    assert sorted(found) == [37, 203, 339, 667, 674, 816, 899]
    assert found[899] == "True" and found[816] == "()"
