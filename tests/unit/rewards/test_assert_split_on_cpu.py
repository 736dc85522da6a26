"""How test asserts are split: which part goes to the sandbox (the holes) and which stays in the trusted process.

No sandbox here: these check the split itself, for every assert form MBPP holds and for the forms a program could use
to pull an expected value into its own process.
"""

import json

import pytest
from shared_data import shared_data

from agent_system.rewards.assert_split import (
    HOLE_PREFIX,
    Unverifiable,
    decode_value,
    defined_names,
    evaluate,
    split_test,
)


@pytest.mark.parametrize(
    ("test", "own", "holes", "wrappers"),
    [
        ("assert add(1, 2) == 3", set(), ["add(1, 2)"], [""]),
        ("assert set(f((3, 4), (4, 5))) == set((4, 5))", set(), ["f((3, 4), (4, 5))"], ["set"]),
        ("assert math.isclose(volume(10), 4188.79, rel_tol=0.001)", set(), ["volume(10)"], [""]),
        ("assert check_str('annie')", set(), ["check_str('annie')"], ["bool"]),
        ("assert not check_str('dawood')", set(), ["check_str('dawood')"], ["bool"]),
        ("assert is_even(4) is True", set(), ["is_even(4)"], [""]),
        ("assert int(lobb_num(5, 3)) == 35", set(), ["lobb_num(5, 3)"], [""]),
        ("assert f(1) == 2 and g(2) == 3", set(), ["f(1)", "g(2)"], ["", ""]),
        ("assert 3 == add(1, 2)", set(), ["add(1, 2)"], [""]),
        ("assert sorted(pair(2, 1)) == [1, 2]", set(), ["pair(2, 1)"], ["sorted"]),
        ("assert max_height(root) == 3", set(), ["max_height(root)"], [""]),
        ("assert pos_nos([-1, 2]) == 2, 'message'", set(), ["pos_nos([-1, 2])"], [""]),  # the message stays here
        # the program defines sum: its call is the program's side
        ("assert sum(10, 15) == 6", {"sum"}, ["sum(10, 15)"], [""]),
        # the program defines set: its side calls its own set, the expected side still means the real one
        ("assert set(f(1)) == set((4, 5))", {"set", "f"}, ["set(f(1))"], [""]),
        ("assert tuple_size((1, 'a')) == sys.getsizeof((1, 'a'))", set(), ["tuple_size((1, 'a'))"], [""]),
    ],
)
def test_the_program_gets_only_its_side(test, own, holes, wrappers):
    split = split_test(test, own)
    assert not split.whole
    assert split.holes == holes and split.wrappers == wrappers


def test_the_expected_side_is_evaluated_here_with_the_real_functions():
    split = split_test("assert set(f(1)) == set((4, 5))", {"set", "f"})
    name = f"{HOLE_PREFIX}0"
    assert evaluate(split.check, {name: {4, 5}}) is True
    assert evaluate(split.check, {name: [4, 5]}) is False  # the program's own set gave a list: not equal to a set
    isclose = split_test("assert math.isclose(volume(10), 4188.79, rel_tol=0.001)", set())
    assert evaluate(isclose.check, {name: 4188.0}) is True and evaluate(isclose.check, {name: 4100.0}) is False


def test_forms_that_cannot_be_split_run_whole():
    for test in (
        "x = f(1)\nassert x == 2",
        "assert f(1) == [i for i in range(3)]",  # the expected side is not evaluable here
        "not an assert",
    ):
        assert split_test(test, set()).whole, test


def test_defined_names():
    code = "import math\nfrom os import path as p\nclass A: pass\ndef sum(a, b): return a - b\nR = 3\n"
    assert defined_names(code, "root = A()") == {"math", "p", "A", "sum", "R", "root"}


def test_decoding_accepts_plain_data_only():
    assert decode_value(["t", [["i", "-0x5"], ["f", "inf"], ["s", "x"], ["n"], ["b", True]]]) == (
        -5,
        float("inf"),
        "x",
        None,
        True,
    )
    assert decode_value(["d", [[["t", [["i", "0x1"]]], ["S", [["y", "6162"]]]]]]) == {(1,): {b"ab"}}
    for malformed in (["x", 1], ["i", 5], ["b", 1], "i", [], ["l", [["q"]]], ["d", [[["l", []], ["n"]]]]):
        with pytest.raises(Unverifiable):
            decode_value(malformed)
    deep = ["n"]
    for _ in range(150):
        deep = ["l", [deep]]
    with pytest.raises(Unverifiable):
        decode_value(deep)


@pytest.mark.external
@pytest.mark.parametrize(
    ("name", "setup_key", "rows"),
    [("mbpp.jsonl", "test_setup_code", 974), ("sanitized-mbpp.jsonl", "test_imports", 427)],
)
def test_every_mbpp_assert_is_split(name, setup_key, rows):
    records = [json.loads(line) for line in shared_data("mbpp", name).read_text().splitlines() if line.strip()]
    assert len(records) == rows
    whole = []
    for record in records:
        setup = record.get(setup_key) or ""
        own = defined_names(record["code"], "\n".join(setup) if isinstance(setup, list) else setup)
        whole += [t for t in record["test_list"] if split_test(t, own).whole]
    assert whole == []
