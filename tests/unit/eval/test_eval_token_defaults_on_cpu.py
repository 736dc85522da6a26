"""The evaluator's feedback budget defaults to the one the run trained with: the export writes the run plan's token
budgets beside its levels (token_budgets.json) and agent_system.eval.math500 reads them for an exported --hl (was:
512 feedback tokens for a run trained with 1,024).

    .venv/bin/python -m pytest tests/unit/eval/test_eval_token_defaults_on_cpu.py
"""

from __future__ import annotations

import argparse
import json

from agent_system.eval import math500
from agent_system.launcher.export import write_token_budgets
from agent_system.models import TOKEN_BUDGETS


def _plan(run_dir, levels):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run_plan.json").write_text(json.dumps({"levels": levels}))


def _args(hl, feedback_tokens=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    math500.add_run_options(parser)
    args = parser.parse_args([] if feedback_tokens is None else ["--feedback-tokens", str(feedback_tokens)])
    args.hl, args.self_correct, args.ll = hl, False, "ll"
    for key, value in {"judge_model": None, "judge_base_url": None}.items():
        setattr(args, key, value)
    return args


def test_an_exported_feedback_writer_is_evaluated_with_its_training_budget(tmp_path):
    run_dir, target = tmp_path / "run", tmp_path / "run" / "export" / "global_step_4"
    budgets = {"prompt_tokens": 4096, "response_tokens": 1024}
    _plan(run_dir, {"ll": budgets, "hl": {"prompt_tokens": 4096, "response_tokens": 768}})
    (target / "hl").mkdir(parents=True)
    write_token_budgets(run_dir, target)
    recorded = json.loads((target / TOKEN_BUDGETS).read_text())
    assert recorded == {"max_prompt_tokens": 4096, "max_tokens": 1024, "feedback_tokens": 768}
    args = _args(str(target / "hl"))
    math500.validate(args)
    assert args.feedback_tokens == 768
    given = _args(str(target / "hl"), feedback_tokens=300)
    math500.validate(given)
    assert given.feedback_tokens == 300  # an explicit value wins


def test_without_a_record_the_default_stays(tmp_path):
    args = _args(str(tmp_path / "some_model"))
    math500.validate(args)
    assert args.feedback_tokens == math500.DEFAULT_FEEDBACK_TOKENS == 512
    _plan(tmp_path / "old_run", {"ll": {"tokens_per_row": 5120}})  # a plan written before the budgets: no record
    write_token_budgets(tmp_path / "old_run", tmp_path)
    assert not (tmp_path / TOKEN_BUDGETS).exists()
