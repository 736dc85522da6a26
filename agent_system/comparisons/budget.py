"""What each baseline of a comparison is given, read from the run plan the trainer itself computes
(:mod:`agent_system.launcher.plan`): generations, optimizer steps, estimators, temperatures and lrs per level, and
where a baseline differs from MLMT's budget.

``bash recipes/compare.sh --plan --out DIR`` writes the table (``budget.md``, ``budget.json``) without training; a
real comparison opens ``comparison.md`` with it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig

from agent_system.comparisons.baselines import BASELINES

logger = logging.getLogger(__name__)

# the budget's columns that a baseline may differ in from MLMT only for a reason its definition states: the solver's,
# and the feedback writer's where both train one
SOLVER_COLUMNS = ("problems_per_step", "steps", "ll_generations_per_step", "ll_optimizer_steps_per_update")
PER_LEVEL_COLUMNS = ("temperature", "lr")


@dataclass(frozen=True)
class BudgetEntry:
    """One baseline's budget (per level: ``ll`` and ``hl``; None where the level does not exist or is frozen)."""

    baseline: str
    problems_per_step: int
    steps: int
    generations_per_step: int  # both levels
    ll_generations_per_step: int
    ll_optimizer_steps_per_update: int
    hl_optimizer_steps_per_update: int | None  # None without a trained HL
    optimizer_steps_per_run: dict[str, int | None]
    n: int
    m: int | None  # None: one turn
    estimator: dict[str, str | None]
    temperature: dict[str, float | None]
    lr: dict[str, float | None]
    critic: dict[str, str | None]
    turn1_shaped: bool  # a reached stage adds the progress bonus α to turn 1's return (acc@t1, Δ, i→c shaped)
    fixed: str  # what the method's definition fixes (Baseline.fixed)

    def differences(self, reference: BudgetEntry) -> list[str]:
        """The columns in which this entry differs from ``reference`` (MLMT's): :data:`SOLVER_COLUMNS`, the solver's
        :data:`PER_LEVEL_COLUMNS`, and the feedback writer's where both train one (a baseline without a trained HL
        is not "different" in the HL's settings: it has none)."""
        found = [name for name in SOLVER_COLUMNS if getattr(self, name) != getattr(reference, name)]
        levels = ["ll"]
        if self.hl_optimizer_steps_per_update is not None and reference.hl_optimizer_steps_per_update is not None:
            levels.append("hl")
            if self.hl_optimizer_steps_per_update != reference.hl_optimizer_steps_per_update:
                found.append("hl_optimizer_steps_per_update")
        for name in PER_LEVEL_COLUMNS:
            found += [
                f"{name} ({level})" for level in levels if getattr(self, name)[level] != getattr(reference, name)[level]
            ]
        return found


@contextmanager
def quiet_logs():
    """The project's and verl's INFO lines off (composition notes, the full plan: each run's ``run_plan.md`` has it)."""
    loggers = [logging.getLogger(name) for name in ("agent_system", "verl")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def plan_run(argv: list[str]) -> tuple[DictConfig, object]:
    """The config and the run plan the trainer makes of ``argv`` (as ``mlmt.plan_only=true`` does, in this process:
    the same config checks, overlay and data). The plan is also written to the run's ``run_plan.json``."""
    from agent_system.config import compose_config
    from agent_system.launcher.main import preflight, prepare_config

    config = prepare_config(compose_config(argv), argv)
    return config, preflight(config)


def budget_entry(name: str, config: DictConfig, plan) -> BudgetEntry:
    """The budget of baseline ``name`` from its prepared ``config`` and its run plan."""
    mlmt = config.mlmt
    trees = {"ll": config.actor_rollout_ref, "hl": config.hl}
    levels = plan.levels

    def trained(level: str) -> bool:
        return level in levels and not levels[level].frozen

    def per_level(value) -> dict:
        return {level: value(level) if trained(level) else None for level in ("ll", "hl")}

    steps_per_update = per_level(lambda level: levels[level].optimizer_steps_per_update)
    return BudgetEntry(
        baseline=name,
        problems_per_step=int(config.data.train_batch_size),
        steps=plan.total_steps,
        generations_per_step=plan.samples_per_step,
        ll_generations_per_step=levels["ll"].samples_per_step,
        ll_optimizer_steps_per_update=steps_per_update["ll"] or 0,
        hl_optimizer_steps_per_update=steps_per_update["hl"],
        optimizer_steps_per_run=per_level(lambda level: levels[level].updates * steps_per_update[level]),
        n=int(mlmt.n),
        m=None if mlmt.feedback == "none" else int(mlmt.m),
        estimator=per_level(lambda level: str(mlmt[level].adv_estimator)),
        temperature={
            level: float(trees[level].rollout.temperature) if level in levels else None for level in ("ll", "hl")
        },
        lr=per_level(lambda level: levels[level].lr.setting),
        critic=per_level(lambda level: levels[level].critic),
        turn1_shaped=any(stage.reached and stage.alpha > 0 for stage in plan.stages),
        fixed=BASELINES[name].fixed,
    )


def _level_pair(values: dict) -> str:
    def text(value) -> str:
        return "–" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    return f"{text(values['ll'])} / {text(values['hl'])}"


def budget_markdown(entries: list[BudgetEntry]) -> str:
    """The budget table: one row per baseline, the columns per level as ``LL / HL`` (– : no trained HL), then what
    each baseline's definition fixes and where it differs from MLMT's budget."""
    reference = next((e for e in entries if e.baseline == "mlmt"), entries[0])
    lines = [
        "| baseline | problems/step | generations/step (LL) | n | m | optimizer steps/update (LL / HL) | "
        "optimizer steps/run (LL / HL) | estimator (LL / HL) | temperature (LL / HL) | lr (LL / HL) | "
        "turn 1 shaped by α | differs from MLMT in |",
        "|" + "---|" * 12,
    ]
    for e in entries:
        hl_steps = "–" if e.hl_optimizer_steps_per_update is None else e.hl_optimizer_steps_per_update
        differs = ", ".join(e.differences(reference)) or "nothing"
        lines.append(
            f"| {e.baseline} | {e.problems_per_step} | {e.generations_per_step} ({e.ll_generations_per_step}) | "
            f"{e.n} | {'–' if e.m is None else e.m} | {e.ll_optimizer_steps_per_update} / {hl_steps} | "
            f"{_level_pair(e.optimizer_steps_per_run)} | {_level_pair(e.estimator)} | "
            f"{_level_pair(e.temperature)} | {_level_pair(e.lr)} | {'yes' if e.turn1_shaped else 'no'} | {differs} |"
        )
    lines += ["", "What each method's definition fixes:", ""]
    lines += [f"- **{e.baseline}**: {e.fixed}" for e in entries]
    return "\n".join(lines) + "\n"


def write_budget(out: Path, entries: list[BudgetEntry], settings: dict) -> None:
    """``budget.json`` and ``budget.md`` in ``out``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    document = {"settings": settings, "baselines": [asdict(e) for e in entries]}
    (out / "budget.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "budget.md").write_text("# The budget of each baseline (its run plan)\n\n" + budget_markdown(entries))
