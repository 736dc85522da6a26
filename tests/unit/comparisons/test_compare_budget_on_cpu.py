"""recipes/compare.sh's budget: every baseline's command line (its run script read back through a recording
interpreter, plus the budget) composes, gets the same solver generations, optimizer steps per update, temperature and
lr as MLMT in the trainer's own run plan, an ablation differs from its base by its keys alone, and ``--plan`` writes
the budget table without training.

    .venv/bin/python -m pytest tests/unit/comparisons/test_compare_budget_on_cpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from agent_system.comparisons import compare
from agent_system.comparisons.baselines import BASELINES, Budget, command_line
from agent_system.config import compose_config
from agent_system.launcher.main import check_config

pytestmark = pytest.mark.external  # runs the bash run scripts

REPO = Path(__file__).resolve().parents[3]
BUDGET = Budget(
    model="smollm2",
    steps=4,
    batch=2,
    n=4,
    m=2,
    lr=3e-7,
    temperature=0.9,
    optimizer_steps=1,
    max_prompt_tokens=1024,
    max_tokens=64,
    feedback_tokens=48,
    train=None,
)


def _leaves(config) -> dict[str, object]:
    """Every leaf of a composed config as {dotted key: value}."""
    flat = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(OmegaConf.to_container(config, resolve=False), "")
    return flat


def test_compare_script_reaches_its_driver():
    """recipes/compare.sh runs the driver module it names (its options print, nothing trains)."""
    env = {**os.environ, "MLMT_PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(REPO / "recipes" / "compare.sh"), "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "--baselines" in result.stdout and "--plan" in result.stdout and "--seeds" in result.stdout


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_composes_with_the_budget(name, tmp_path):
    config = compose_config(command_line(name, BUDGET, tmp_path / name, 7, [], {}))
    check_config(config)
    assert config.trainer.total_training_steps == 4 and config.data.train_batch_size == 2
    assert config.data.train_files is None and config.data.max_response_length == 64  # the embedded task
    assert config.data.seed == config.actor_rollout_ref.rollout.seed == 7  # data order and sampling
    assert config.actor_rollout_ref.actor.optim.lr == 3e-7 and config.actor_rollout_ref.rollout.temperature == 0.9
    if config.mlmt.feedback == "model":
        assert config.hl.actor.optim.lr == 3e-7 and config.hl.rollout.temperature == 0.9
        assert config.hl.rollout.seed == 7 and config.hl.rollout.response_length == 48
    two_turns = config.mlmt.feedback != "none"
    assert (config.mlmt.n, config.mlmt.m if two_turns else None) == ((4, 2) if two_turns else (12, None))
    assert list(config.mlmt.stages.schedule) in ([0], [0, 3])  # a staged run switches at mid-run
    assert config.mlmt.ll_gpus == 1  # one device per model


@pytest.mark.parametrize("name", [n for n, b in BASELINES.items() if b.ablation_of])
def test_an_ablation_differs_from_its_base_by_its_keys_alone(name, tmp_path):
    """Fixed feedback is MLMT with the feedback writer frozen: the composed configs differ in that key alone (and
    in where the run writes). Was: another script with another estimator, n, m, temperature and step count."""
    baseline = BASELINES[name]
    ablation = _leaves(compose_config(command_line(name, BUDGET, tmp_path / "a", 0, [], {})))
    base = _leaves(compose_config(command_line(baseline.ablation_of, BUDGET, tmp_path / "b", 0, [], {})))
    differing = {key for key in ablation.keys() | base.keys() if ablation.get(key) != base.get(key)}
    assert differing == {key.split("=")[0] for key in baseline.keys} | {"trainer.default_local_dir"}


@pytest.mark.parametrize("optimizer_steps", [1, 2])
def test_the_plan_gives_every_baseline_mlmt_s_budget(optimizer_steps, tmp_path):
    """Each baseline's run plan (the trainer's own) has MLMT's problems and solver generations per step, the same
    optimizer steps per update for every trained policy, and the same temperature and lr. Was: solver optimizer steps
    per update 96 (MLMT) against 16 (fixed feedback) and 8 (ArCHer) at the harness's GPU budget."""
    args = compare.parse_args(
        ["--plan", "--out", str(tmp_path), "--steps", "4", "--optimizer-steps", str(optimizer_steps)]
    )
    _, entries = compare.plan_baselines(args, tmp_path)
    assert [e.baseline for e in entries][0] == "mlmt" and len(entries) == len(BASELINES)
    mlmt = entries[0]
    assert mlmt.ll_generations_per_step == 2 * (4 + 4 * 2)  # n attempts and n·m refinements per problem
    for entry in entries:
        assert entry.differences(mlmt) == [], entry.baseline
        assert entry.ll_optimizer_steps_per_update == optimizer_steps, entry.baseline
        assert entry.hl_optimizer_steps_per_update in (None, optimizer_steps), entry.baseline
        assert entry.optimizer_steps_per_run["ll"] == 4 * optimizer_steps
    by_name = {e.baseline: e for e in entries}
    assert by_name["fixed_feedback"].hl_optimizer_steps_per_update is None  # frozen: no optimizer
    assert by_name["grpo"].m is None and by_name["grpo"].n == 12  # one turn: n·(1 + m) attempts
    assert by_name["mlmt"].turn1_shaped and not by_name["grpo"].turn1_shaped  # stage II's α shapes turn 1


def test_compare_plan_writes_the_budget_and_trains_nothing(tmp_path):
    compare.main(["--plan", "--out", str(tmp_path), "--steps", "4", "--baselines", "grpo,mlmt"])
    document = json.loads((tmp_path / "budget.json").read_text())
    rows = {row["baseline"]: row for row in document["baselines"]}
    assert list(rows) == ["mlmt", "grpo"]  # MLMT first
    for field in (
        "generations_per_step",
        "ll_optimizer_steps_per_update",
        "hl_optimizer_steps_per_update",
        "temperature",
        "estimator",
        "n",
        "m",
        "lr",
        "optimizer_steps_per_run",
    ):
        assert all(field in row for row in rows.values()), field
    assert rows["grpo"]["hl_optimizer_steps_per_update"] is None and rows["grpo"]["estimator"]["hl"] is None
    assert rows["mlmt"]["estimator"] == {"ll": "grpo", "hl": "grpo"}
    table = (tmp_path / "budget.md").read_text()
    assert "| mlmt | 2 | 40 (24) | 4 | 2 | 1 / 1 |" in table and "| grpo | 2 | 24 (24) | 12 | – | 1 / – |" in table
    assert not list(tmp_path.glob("*/seed0/checkpoints"))  # planned, not trained


def test_a_refused_baseline_stops_the_plan_by_name(tmp_path, capsys):
    """One step cannot hold stage I and stage II: the trainer's own check refuses MLMT's schedule, named."""
    with pytest.raises(SystemExit) as stopped:
        compare.main(["--plan", "--out", str(tmp_path), "--steps", "1", "--baselines", "grpo,mlmt"])
    assert stopped.value.code == 2
    assert "error: mlmt: mlmt.stages.schedule=[0, 1]" in capsys.readouterr().err


def test_evaluating_on_training_problems_stops_unless_allowed(tmp_path, capsys):
    """An evaluation set that overlaps training stops the comparison before any training (was: a log warning)."""
    from agent_system.data.default_dataset import generate_rows

    dataset = compose_config([]).mlmt.dataset
    train_rows = generate_rows(dataset.n_train, dataset.n_val, dataset.seed, dataset.max_difficulty)[0]
    evaluated = tmp_path / "train.parquet"
    pd.DataFrame(train_rows[:4]).to_parquet(evaluated)
    options = ["--out", str(tmp_path / "out"), "--steps", "2", "--baselines", "grpo", "--eval-data", str(evaluated)]
    with pytest.raises(SystemExit) as stopped:
        compare.main([*options, "--limit", "4"])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "4 of the 4 evaluated problems" in message and "--allow-overlap" in message
    assert not (tmp_path / "out" / "grpo" / "seed0" / "checkpoints").exists()


def test_per_baseline_overrides_name_the_bad_setting():
    settings = ["archer:mlmt.archer.batch_size=4", "archer:mlmt.archer.updates_per_step=2", "grpo:data.seed=1"]
    assert compare.per_baseline_overrides(settings) == {
        "archer": ["mlmt.archer.batch_size=4", "mlmt.archer.updates_per_step=2"],
        "grpo": ["data.seed=1"],
    }
    for bad in ("archr:mlmt.archer.batch_size=4", "archer", "archer:mlmt.archer.batch_size"):
        with pytest.raises(ValueError, match=repr(bad).replace("[", r"\[").replace(".", r"\.")):
            compare.per_baseline_overrides([bad])
