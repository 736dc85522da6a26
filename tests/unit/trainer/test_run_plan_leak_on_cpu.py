"""The run plan's leak section (agent_system/launcher/plan.py, docs/RUN_PLAN.md, docs/LEAK.md): which checks are on
(the rules and value presence, on every HL feedback of a math row), how many training rows they read (code and YAML
task rows: not applicable), the penalty and whether it acts, and the confidence term's quoting route; and the
training rows' sources reaching the plan from ``preflight``."""

from __future__ import annotations

import functools

import pandas as pd
import pytest
from config_copies import copier

from agent_system.config import compose_config
from agent_system.launcher import main as launcher
from agent_system.launcher.main import set_schedule_horizon
from agent_system.launcher.plan import build_plan, render_markdown

CHECKS = (
    "- checks: the rules (leak.py, rules 1-8) + value presence (value_presence.py), on every HL feedback of a math row"
)
NOT_APPLICABLE = "code (MBPP) and YAML task rows: not applicable, not checked"


@functools.cache
def _copies(overrides: tuple[str, ...]):
    return copier(compose_config(list(overrides)))


def _section(overrides=(), sources=None):
    config = _copies(tuple(overrides))()
    set_schedule_horizon(config, 100)
    plan = build_plan(config, 100, 8, sources)
    page = render_markdown(plan)
    start = page.index("## Leak check (docs/LEAK.md)\n")
    return plan, page[start : page.index("\n\n", start)].splitlines()[1:]


def test_default_run_checks_math_feedbacks_and_penalises_nothing():
    plan, lines = _section(sources=["arith"] * 100)
    assert lines[0].startswith(CHECKS) and "(train/leak_rate, val/leak_rate)" in lines[0]
    assert lines[1] == f"- rows checked: 100 of 100 training rows (math 100); {NOT_APPLICABLE}"
    assert lines[2] == "- penalty: off (mlmt.reward.leak_penalty=0): leaks are measured, not in the HL's reward"
    assert len(lines) == 3 and not plan.leak.penalty_acts


def test_penalty_on_mixed_rows_acts_on_the_math_ones():
    plan, lines = _section(["mlmt.reward.leak_penalty=0.5"], ["math"] * 60 + ["mbpp"] * 30 + ["gsm8k"] * 10)
    assert lines[1] == f"- rows checked: 70 of 100 training rows (code 30, math 70); {NOT_APPLICABLE}"
    assert lines[2] == "- penalty: 0.5 off the HL reward of each leaking feedback (mlmt.reward.leak_penalty)"
    saved = plan.to_json()["leak"]
    assert saved["penalty"] == 0.5 and saved["penalty_acts"] and saved["train_rows"] == {"code": 30, "math": 70}
    assert saved["checks"] and not any("leak_penalty" in notice for notice in plan.notices)


def test_penalty_on_rows_without_a_math_task_never_acts():
    """Start-up refuses it once the rows are read (tests/unit/trainer/test_accepted_keys_act_on_cpu.py); a plan
    (``mlmt.plan_only=true`` never reaches that check) says so in its section and its notices."""
    plan, lines = _section(["mlmt.reward.leak_penalty=0.5"], ["mbpp"] * 70 + ["yaml_task"] * 30)
    assert lines[1] == f"- rows checked: 0 of 100 training rows (code 70, yaml 30); {NOT_APPLICABLE}"
    assert lines[2] == (
        "- penalty: 0.5 NEVER ACTS: no training row is a math task (MBPP and YAML task feedbacks are not checked); "
        "start-up refuses it"
    )
    assert not plan.leak.penalty_acts
    assert "mlmt.reward.leak_penalty=0.5 never acts: no training row is a math task" in " ".join(plan.notices)


def test_the_confidence_terms_quoting_route_is_named():
    _, lines = _section(["mlmt.reward.confidence_lambda=0.1"], ["math"] * 100)
    assert lines[-1] == (
        "- confidence term (confidence_lambda=0.1): it pays for feedback that makes the reference solution likelier; "
        "the check reads the gold's value, not quoted steps of the reference (docs/LEAK.md, \"The confidence term and "
        'quoting")'
    )


@pytest.mark.parametrize("feedback", ["self", "none"])
def test_without_an_hl_nothing_is_checked(feedback):
    plan, lines = _section([f"mlmt.feedback={feedback}"], ["math"] * 100)
    assert lines == [f"- off: no HL feedback to check (mlmt.feedback={feedback})"] and plan.leak.checks == []


def test_sources_not_given():
    _, lines = _section(["mlmt.reward.leak_penalty=0.5"])
    assert lines[1] == f"- rows checked: math rows only (the training rows' sources not read); {NOT_APPLICABLE}"
    assert lines[2].startswith("- penalty: 0.5 off the HL reward")


def test_preflight_hands_the_training_rows_sources_to_the_plan(monkeypatch, tmp_path):
    """``preflight`` (what ``mlmt.plan_only=true`` runs) reads the rows' ``data_source`` into the plan."""
    frame = pd.DataFrame({"data_source": ["mbpp"] * 3 + ["math"], "prompt": [[{"role": "user", "content": "x"}]] * 4})
    seen = {}

    def plan_of(config, train_rows, val_rows, train_sources=None):
        seen["sources"] = train_sources
        raise RuntimeError("stop after the plan")

    monkeypatch.setattr(launcher, "_read_frame", lambda path: frame if path else None)
    monkeypatch.setattr("agent_system.launcher.plan.build_plan", plan_of)
    monkeypatch.setattr("agent_system.data.heldout.check_train_splits", lambda *args: None)
    config = _copies(())()
    config.trainer.default_local_dir = str(tmp_path)
    config.data.train_files = "train.parquet"  # read by the stand-in above
    with pytest.raises(RuntimeError, match="stop after the plan"):
        launcher.preflight(config)
    assert seen["sources"] == ["mbpp", "mbpp", "mbpp", "math"]
