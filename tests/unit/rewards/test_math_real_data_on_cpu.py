"""Agreement of the math grader with official labels on the shared MATH-500 and GSM8K files."""

import json

import pytest
from math_verify import verify
from shared_data import shared_data

from agent_system.rewards import compute_score
from agent_system.rewards.math_answer import gsm8k_gold, last_boxed_content, normalize_answer
from agent_system.rewards.math_reward import answers_match, parse_answer, parse_gold

pytestmark = pytest.mark.external  # reads ../shared/data


def _rows(relative):
    with open(shared_data(relative)) as handle:
        return [json.loads(line) for line in handle]


def test_math500_solution_boxes_agree_with_answer_field():
    rows = _rows("math500/test.jsonl")
    agree = sum(answers_match(last_boxed_content(r["solution"]) or "", r["answer"]) for r in rows)
    assert agree == len(rows) == 500


def test_math500_answers_verify_through_math_verify():
    # bypass the string fast path: math-verify itself must parse every gold form and find it equal to itself
    rows = _rows("math500/test.jsonl")[::4]
    golds = [normalize_answer(r["answer"]) for r in rows]
    misses = [g for g in golds if not verify(list(parse_gold(g)), parse_answer(g))]
    assert misses == []


def test_gsm8k_final_lines_agree_with_gold():
    rows = _rows("gsm8k/test.jsonl")
    agree = sum(compute_score("gsm8k", r["answer"], gsm8k_gold(r["answer"]))["acc"] for r in rows)
    assert agree == len(rows) == 1319
