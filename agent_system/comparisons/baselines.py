"""The baselines of the comparison and the one budget they share: each baseline's training command line.

A baseline is its run script (the command a user runs: ``mlmt-configs/math/*.sh``, ``recipes/*/run_*.sh``), read back
as the argument list it passes to ``python -m verl.trainer.main_mlmt`` (the script runs with a recording interpreter,
:func:`script_argv`), plus the budget's overrides, which win over the script's GPU settings. The budget
(docs in ``recipes/README.md``, "Like for like"):

* the same model, training data, problems per step (``--batch``), steps, token budgets and seed for every baseline;
* the same solver generations per problem: a two-turn baseline gets ``--n`` attempts and ``--m`` second turns per
  attempt, a single-turn one ``n · (1 + m)`` attempts;
* the same sampling temperature and the same constant lr for every trained policy (``--temperature``, ``--lr``);
* the same optimizer steps per update (``--optimizer-steps``) for every trained policy and critic: the mini-batch
  is the level's rows per update divided by it, so no method moves its weights more often because it generates more
  rows;
* SCoRe-style stages switch at the middle of the run.

What a method's definition fixes (its estimator, its critic, REINFORCE's lack of a baseline...) stays, and each
:class:`Baseline` states it. An ablation (fixed feedback) is its base's very command line plus its ``keys``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Baseline:
    """One row of the comparison.

    Attributes:
        script: its run script, relative to the repository.
        mode: how it is evaluated: ``feedback`` (its solver and trained HL), ``frozen_hl`` (its solver and the initial
            model as HL), ``self_correct`` (its solver correcting itself) or ``single`` (its solver alone).
        devices: ``GPUS`` for its script (ArCHer's critic takes one device of its own).
        keys: overrides on top of ``ablation_of``'s command line (an ablation differs from its base by these alone).
        ablation_of: the baseline whose command line this one extends, or None.
        fixed: what the method's definition fixes that differs from MLMT's budget (printed in the budget table).
    """

    script: str
    mode: str
    devices: int = 1
    keys: tuple[str, ...] = ()
    ablation_of: str | None = None
    fixed: str = ""


MLMT_SCRIPT = "mlmt-configs/math/HLT_LLT_GRPO_1_1.sh"
BASELINES: dict[str, Baseline] = {
    "mlmt": Baseline(MLMT_SCRIPT, "feedback", fixed="GRPO at both levels"),
    "fixed_feedback": Baseline(
        MLMT_SCRIPT,
        "frozen_hl",
        keys=("mlmt.hl.freeze=true",),
        ablation_of="mlmt",
        fixed="MLMT with the feedback writer frozen (its only difference)",
    ),
    "grpo": Baseline("recipes/grpo/run_grpo.sh", "single", fixed="one turn: no feedback, no refinement"),
    "score": Baseline(
        "recipes/score/run_score.sh",
        "self_correct",
        fixed="no feedback writer: the solver corrects itself under a fixed instruction; REINFORCE (no baseline)",
    ),
    "rl_guided_score": Baseline(
        "recipes/rl_guided_score/run_rl_guided_score.sh",
        "feedback",
        fixed="REINFORCE at both levels; the HL on R3 with a KL loss (0.05) to its reference",
    ),
    "value_shaping": Baseline(
        "recipes/value_shaping/run_value_shaping.sh",
        "feedback",
        fixed="solver: R − V(prompt) with a critic (its own lr); HL: REINFORCE on R + c·V",
    ),
    "archer": Baseline(
        "recipes/archer/run_archer.sh",
        "single",
        devices=2,
        fixed="one turn; an utterance-level critic with its own settings (mlmt.archer.*) on a device of its own",
    ),
    "reinforce_kl": Baseline(
        "recipes/reinforce_kl/run_reinforce_kl.sh",
        "single",
        fixed="one turn; REINFORCE with β 0.25·KL to a reference refreshed every 2 steps",
    ),
}


@dataclass(frozen=True)
class Budget:
    """What every baseline gets (the harness's options)."""

    model: str
    steps: int
    batch: int  # problems per step
    n: int  # attempts per problem (two-turn baselines)
    m: int  # second turns per attempt (two-turn baselines)
    lr: float
    temperature: float
    optimizer_steps: int  # per update, per trained policy and critic
    max_prompt_tokens: int
    max_tokens: int
    feedback_tokens: int
    train: str | None  # training parquet; None: the embedded task


def script_argv(script: str, env: dict[str, str]) -> list[str]:
    """The arguments ``script`` gives ``python -m verl.trainer.main_mlmt`` under ``env``: the script runs through bash
    with ``MLMT_PYTHON`` set to a recording stub (nothing trains).

    Raises:
        RuntimeError: The script failed; the message quotes its error output.
    """
    with tempfile.TemporaryDirectory(prefix="mlmt-argv-") as folder:
        stub, record = Path(folder) / "python", Path(folder) / "argv"
        stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$MLMT_ARGV_RECORD"\n')
        stub.chmod(0o755)
        run_env = {**os.environ, **env, "MLMT_PYTHON": str(stub), "MLMT_ARGV_RECORD": str(record)}
        result = subprocess.run(
            ["bash", str(REPO / script)], env=run_env, capture_output=True, text=True, timeout=60, cwd=REPO
        )
        if result.returncode != 0 or not record.is_file():
            raise RuntimeError(f"{script}: exit {result.returncode}: {result.stderr.strip()[-2000:]}")
        argv = record.read_text().split("\0")[:-1]
    if argv[:2] != ["-m", "verl.trainer.main_mlmt"]:
        raise RuntimeError(f"{script} does not run `python -m verl.trainer.main_mlmt` (it ran {argv[:2]})")
    return argv[2:]


def script_env(budget: Budget, baseline: Baseline) -> dict[str, str]:
    """The environment of the baseline's script: the model and one device per model."""
    return {"MODEL": budget.model, "GPUS": str(baseline.devices), "LL_GPUS": "1", "HL_GPUS": "1"}


def shared_overrides(budget: Budget, run_dir: Path, seed: int) -> list[str]:
    """The budget's overrides that do not depend on the baseline's config."""
    data = [f"data.train_files={budget.train}", f"data.val_files={budget.train}"] if budget.train else []
    data = data or ["data.train_files=null", "data.val_files=null"]  # the embedded task
    return [
        *data,
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={budget.steps}",
        f"trainer.save_freq={budget.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.keep_best=null",  # no validation during the runs: each is evaluated once at its last step
        f"data.train_batch_size={budget.batch}",
        f"data.max_prompt_length={budget.max_prompt_tokens}",
        f"data.max_response_length={budget.max_tokens}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.rollout.temperature={budget.temperature}",
        f"actor_rollout_ref.actor.optim.lr={budget.lr}",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "actor_rollout_ref.actor.ppo_epochs=1",
    ]


def turn_overrides(config: DictConfig, budget: Budget) -> list[str]:
    """The budget's overrides that depend on the baseline's turns (its composed ``config``): its generations per
    problem, the HL's settings when it has one, the stage switch."""
    from agent_system.config import has_hl

    if config.mlmt.feedback == "none":
        overrides = [f"mlmt.n={budget.n * (1 + budget.m)}"]
    else:
        overrides = [f"mlmt.n={budget.n}", f"mlmt.m={budget.m}"]
    if has_hl(config):
        overrides += [
            f"hl.rollout.response_length={budget.feedback_tokens}",
            f"hl.rollout.seed={config.data.seed}",
            f"hl.rollout.temperature={budget.temperature}",
            f"hl.actor.optim.lr={budget.lr}",
            "hl.actor.optim.lr_scheduler_type=constant",
            "hl.actor.ppo_epochs=1",
        ]
    if len(config.mlmt.stages.schedule) > 1:  # stage I for the first half, stage II for the rest
        overrides.append(f"mlmt.stages.schedule=[0,{budget.steps // 2 + 1}]")
    return overrides


def mini_batch_overrides(config: DictConfig, optimizer_steps: int) -> list[str]:
    """Each trained policy's and critic's mini-batch: its level's rows per update (padded to its ranks) divided into
    ``optimizer_steps`` parts, rounded up (the run plan shows the steps this gives)."""
    from agent_system.config import frozen_levels, has_hl
    from agent_system.launcher.plan import level_rows, level_world_size, mini_batch_keys

    frozen = frozen_levels(config)
    overrides = []
    for level in ("ll", "hl") if has_hl(config) else ("ll",):
        if frozen[level]:
            continue
        world = level_world_size(config, level)
        per_rank = -(-level_rows(config, level) // world)
        mini = -(-per_rank // optimizer_steps) * world
        overrides += [f"{key}={mini}" for key in mini_batch_keys(config, level)]
    return overrides


def command_line(
    name: str, budget: Budget, run_dir: Path, seed: int, user: list[str], per_baseline: dict[str, list[str]]
) -> list[str]:
    """The arguments of ``python -m verl.trainer.main_mlmt`` that train baseline ``name`` under ``budget``.

    The script's own arguments, then the budget's (they win), then ``user`` overrides for every run and the
    baseline's own ``per_baseline[name]`` (they win over the budget). An ablation is its base's command line with its
    ``keys`` added last (then its own ``per_baseline`` overrides): the two differ by those keys alone, besides
    ``trainer.default_local_dir``.
    """
    from agent_system.config import compose_config

    baseline = BASELINES[name]
    if baseline.ablation_of:
        base = command_line(baseline.ablation_of, budget, run_dir, seed, user, {})
        return [*base, *baseline.keys, *per_baseline.get(name, [])]
    own = [*user, *per_baseline.get(name, [])]
    argv = [*script_argv(baseline.script, script_env(budget, baseline)), *shared_overrides(budget, run_dir, seed)]
    argv += turn_overrides(compose_config([*argv, *own]), budget)
    argv += mini_batch_overrides(compose_config([*argv, *own]), budget.optimizer_steps)
    return [*argv, *own]
