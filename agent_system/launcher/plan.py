"""The pre-flight run plan: what each level of a run will get, computed from the config and the data before any
worker starts, and checked against what the run did when it ends.

The plan gives, per level: the steps it is updated on and how many; its trainable parameters (all, or a LoRA
adapter's, counted from the model's ``config.json``); the lr verl's scheduler gives it at its first
update, its peak and its last update; its rows, token budget, effective mini-batch size and optimizer steps per
update; its reference model and critic, and whether it is frozen; the samples it generates per step. For the run: the
stage periods with the β and α acting on each turn, the checkpoint and validation steps, the leak checks that are on
(:class:`LeakPlan`: which feedbacks are checked, the penalty and whether it acts), and the GPU memory of each
device (:mod:`agent_system.launcher.memory_estimate`; a notice when a device's peak exceeds it, which start-up
refuses). It is logged and
written as ``run_plan.json`` and ``run_plan.md`` in ``trainer.default_local_dir``. Print it without starting anything:

    python -m verl.trainer.main_mlmt mlmt.plan_only=true [key=value ...]

:func:`plan_differences` compares a plan with the trainer's step history (``MLMTTrainer.history``); the trainer
fails loudly on any difference at the end of a run.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from agent_system import methods
from agent_system.config import CRITIC_TREES, POLICY_TREES, ConfigError, frozen_levels, frozen_reasons, level_view
from agent_system.launcher.devices import plan_target
from agent_system.launcher.gpu_checks import idle_devices_notice, visible_gpus
from agent_system.launcher.memory_estimate import (
    MemoryPlan,
    MemoryUnavailable,
    device_memory,
    memory_plan,
    read_shape,
    render_memory,
    trainable_parameters,
)
from agent_system.levels.policy import mini_batch_size
from agent_system.methods.leak_reader import reader_on
from agent_system.rewards.scoring import task_kind
from agent_system.trainer.advantages import critic_levels
from agent_system.trainer.schedule import update_steps
from agent_system.trainer.state import total_training_steps

logger = logging.getLogger(__name__)

PLAN_JSON, PLAN_MD = "run_plan.json", "run_plan.md"
LR_TOLERANCE = 1e-9  # relative: the run's lr comes from the same scheduler function as the plan's


class PlanMismatch(RuntimeError):
    """The run did not do what its pre-flight plan said; the message lists every difference."""


# ------------------------------------------------------------------------------------------------------ pieces
@dataclass
class LrPlan:
    """The lr verl's scheduler gives one optimizer, per update (``total_training_steps`` = ``horizon``)."""

    section: str  # e.g. actor_rollout_ref.actor.optim
    scheduler: str  # lr_scheduler_type
    horizon: int  # the scheduler's total_training_steps
    warmup_updates: int
    first: float  # lr of the first update
    peak: float
    peak_update: int  # 1-based update that first reaches the peak
    last: float  # lr of the last update
    after_last: float  # lr verl reports after the last update (its scheduler's next value)
    setting: float  # optim.lr
    completed: bool  # the peak is reached and the schedule's end coincides with the last update


@dataclass
class LevelPlan:
    level: str
    model: str
    frozen: bool
    parameters: int | None  # of the model, from its config.json (None: not counted, see tuning)
    trainable_parameters: int | None  # updated by its optimizer: all, a LoRA adapter's, 0 when frozen
    estimator: str  # mlmt.<level>.adv_estimator (a method's or a plug-in's)
    tuning: str  # "full fine-tuning", the LoRA settings, or why the parameters are not counted
    update_steps: list[int]
    updates: int
    update_steps_text: str
    lr: LrPlan | None
    reference: str
    critic: str
    critic_lr: LrPlan | None
    rows_per_update: int
    world_size: int
    prompt_tokens: int  # data.max_prompt_length
    response_tokens: int  # the level's response budget per turn (LL: data.max_response_length, HL: its rollout's)
    tokens_per_row: int  # prompt budget + response budget
    tokens_per_step: int  # rows × tokens_per_row: the most a step's update can hold
    mini_batch_setting: int
    mini_batch: int
    optimizer_steps_per_update: int
    samples_per_step: int  # generations of this level's model per training step


@dataclass
class StagePlan:
    index: int
    stage_id: int
    first_step: int
    last_step: int  # < first_step: never reached
    reached: bool
    beta_turn1: float  # mlmt.stages.beta_turn1 of the stage (the solver's attempt)
    beta_turn2: float  # beta_turn2 (the HL's feedback)
    beta_turn3: float  # beta_turn3 (the solver's refinement)
    alpha: float  # progress bonus (stage II): α(R3 − R1) on turn 3, α(R̄3 − R1) on turn 1
    turn1_task_reward: bool  # stage I: turn 1 gets only its KL term


@dataclass
class LeakPlan:
    """The leak checks on the HL's feedbacks (docs/LEAK.md): on with an HL, on math rows only."""

    feedback: str  # mlmt.feedback: only "model" has HL feedbacks to check
    checks: list[str]  # what decides a leak; [] without a feedback turn
    train_rows: dict[str, int] | None  # training rows per task kind (math / code / yaml / unknown); None: not given
    penalty: float  # mlmt.reward.leak_penalty
    penalty_acts: bool  # > 0, on a trained HL's reward, with a math training row (start-up refuses it otherwise)
    penalty_idle: str  # why a penalty > 0 cannot act ("" when it acts or is off)
    confidence_lambda: float  # the confidence term pays for quoting the reference, which the check does not read
    judge: dict[str, str] = field(default_factory=dict)  # mlmt.reward.leak_judge's model and base_url ({}: none)


@dataclass
class RunPlan:
    total_steps: int
    steps_from: str
    schedule: str
    levels: dict[str, LevelPlan]
    stages: list[StagePlan]
    checkpoint_steps: list[int]
    validation_steps: list[int]
    samples_per_step: int
    samples_per_validation: int
    notices: list[str] = field(default_factory=list)
    memory: MemoryPlan | None = None  # per-device GPU memory estimate
    memory_unavailable: str = ""  # why there is none (a model folder without config.json)
    plugins: list[str] = field(default_factory=list)  # mlmt.plugins: modules imported for their registrations
    device: str = ""  # the device planned for, in words (devices.plan_target: mlmt.plan_device, this GPU, the CPU)
    leak: LeakPlan | None = None  # the leak checks that are on

    def to_json(self) -> dict:
        return asdict(self)

    def stage_index_at(self, step: int) -> int:
        return max(s.index for s in self.stages if s.first_step <= max(step, 1))


# ------------------------------------------------------------------------------------------------------ helpers
def run_steps(config: DictConfig, train_rows: int) -> int:
    """The run's steps (``trainer.total_training_steps``, or epochs of the training data)."""
    trainer = config.trainer
    return total_training_steps(
        trainer.total_training_steps, trainer.total_epochs, train_rows, config.data.train_batch_size
    )


def steps_source(config: DictConfig, train_rows: int) -> str:
    trainer = config.trainer
    if trainer.total_training_steps is not None:
        return f"trainer.total_training_steps={trainer.total_training_steps}"
    per_epoch = train_rows // config.data.train_batch_size
    return (
        f"trainer.total_epochs={trainer.total_epochs} × ⌊{train_rows} training rows / data.train_batch_size="
        f"{config.data.train_batch_size}⌋ = {trainer.total_epochs} × {per_epoch}"
    )


def level_update_steps(config: DictConfig, total: int) -> dict[str, list[int]]:
    return update_steps(total, config.mlmt.schedule, frozen_levels(config))


def optimizer_sections(config: DictConfig, level: str) -> list[str]:
    """The optimizer sections stepped on ``level``'s updates: its actor's, and its critic's when it has one."""
    sections = [f"{POLICY_TREES[level]}.actor.optim"]
    if critic_name(config, level) == CRITIC_TREES[level]:
        sections.append(f"{CRITIC_TREES[level]}.optim")
    return sections


def critic_name(config: DictConfig, level: str) -> str:
    """The level's value model: verl's critic section, one a method trains itself, or "none"."""
    if level in critic_levels(config):
        return CRITIC_TREES[level]
    return methods.own_critics(config).get(level, "none")


def lr_plan(config: DictConfig, section: str, updates: int) -> LrPlan:
    """The lr of each of ``updates`` updates from verl's own scheduler, built as verl's FSDP engine builds it."""
    import torch

    from agent_system import verl_compat as vc

    optim = vc.omega_conf_to_dataclass(OmegaConf.select(config, section))
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=optim.lr)
    scheduler = vc.build_lr_scheduler(optim, optimizer)
    lrs = []
    for _ in range(updates):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()  # no gradient: a no-op, so that the scheduler steps in torch's expected order
        scheduler.step()
    after = scheduler.get_last_lr()[0]
    horizon = int(optim.total_training_steps)
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else int(optim.lr_warmup_steps_ratio * horizon)
    peak = max(lrs) if lrs else 0.0
    peak_update = lrs.index(peak) + 1 if lrs else 0
    reaches_peak = bool(lrs) and math.isclose(peak, optim.lr, rel_tol=1e-6)
    ends = optim.lr_scheduler_type == "constant" or horizon == updates
    return LrPlan(
        section=section,
        scheduler=optim.lr_scheduler_type,
        horizon=horizon,
        warmup_updates=int(warmup),
        first=lrs[0] if lrs else 0.0,
        peak=peak,
        peak_update=peak_update,
        last=lrs[-1] if lrs else 0.0,
        after_last=after,
        setting=float(optim.lr),
        completed=(reaches_peak and ends) or not lrs,
    )


def lr_after(config: DictConfig, section: str, updates: int) -> float:
    """The lr verl reports after ``updates`` updates (its scheduler's value for the next one)."""
    return lr_plan(config, section, updates).after_last if updates else 0.0


def compress_steps(steps: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8, 9]`` -> ``"1-3, 5, 7-9"``; four or more equal ranges at a fixed stride are written
    ``"a-b, c-d, …, y-z (every k)"``."""
    if not steps:
        return "none"
    ranges: list[tuple[int, int]] = []
    for step in steps:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], step)
        else:
            ranges.append((step, step))

    def text(r: tuple[int, int]) -> str:
        return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"

    parts, i = [], 0
    while i < len(ranges):
        j = i
        if i + 1 < len(ranges):
            stride, length = ranges[i + 1][0] - ranges[i][0], ranges[i][1] - ranges[i][0]
            while (
                j + 1 < len(ranges)
                and ranges[j + 1][0] - ranges[j][0] == stride
                and ranges[j + 1][1] - ranges[j + 1][0] == length
            ):
                j += 1
        if j - i >= 3:
            parts.append(f"{text(ranges[i])}, {text(ranges[i + 1])}, …, {text(ranges[j])} (every {stride})")
        else:
            parts += [text(r) for r in ranges[i : j + 1]]
        i = j + 1
    return ", ".join(parts)


def _due_steps(freq: int, total: int) -> list[int]:
    if freq <= 0:
        return []
    return sorted({*range(freq, total + 1, freq), total})


def level_world_size(config: DictConfig, level: str) -> int:
    """Data-parallel ranks of ``level``'s actor: its pool under ``split`` placement, every device otherwise."""
    if config.mlmt.placement == "split":
        return int(config.mlmt[f"{level}_gpus"])
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.get("nnodes", 1))


def level_rows(config: DictConfig, level: str) -> int:
    """Rows of one update: LL = B·n turn-1 + B·n·m turn-3 rows (B·n alone with ``mlmt.feedback=none``), HL =
    B·n·m turn-2 rows."""
    mlmt, problems = config.mlmt, config.data.train_batch_size
    attempts = problems * mlmt.n
    if level == "hl":
        return attempts * mlmt.m
    return attempts if mlmt.feedback == "none" else attempts * (1 + mlmt.m)


def level_trainable(config: DictConfig, level: str, frozen: bool) -> tuple[int | None, int | None, str]:
    """``(parameters, trainable parameters, tuning)`` of ``level``'s policy, from its model's ``config.json`` and
    verl's LoRA keys (``<tree>.model.lora_rank``, ``lora_alpha``, ``target_modules``, ``exclude_modules``): no
    weights are loaded. Full fine-tuning trains every parameter; LoRA, ``rank × (in + out)`` per targeted linear
    layer (:meth:`~agent_system.launcher.memory_estimate.ModelShape.lora_parameters`)."""
    tree = POLICY_TREES[level]
    model = config[tree].model
    try:
        shape = read_shape(model.path, f"{tree}.model.path")
        trainable = trainable_parameters(model, shape, f"{tree}.model")
    except MemoryUnavailable as error:
        lora = int(model.get("lora_rank", 0) or 0) > 0
        return None, None, f"{'LoRA' if lora else 'full fine-tuning'}; parameters not counted: {error}"
    tuning = trainable.lora or "full fine-tuning"
    return shape.parameters, 0 if frozen else trainable.trained, tuning


@dataclass(frozen=True)
class MiniBatchCut:
    """An optimizer whose mini-batch setting is cut to a divisor of its level's rows (:func:`mini_batch_cuts`)."""

    key: str  # <tree>.actor.ppo_mini_batch_size or <critic tree>.ppo_mini_batch_size
    setting: int
    size: int  # the effective mini-batch: rows per optimizer step
    rows: int  # rows per update, padded to a multiple of the ranks
    ranks: int  # data-parallel ranks of the level

    @property
    def below_half(self) -> bool:
        """Cut below half of what the setting asks (the setting, or all the rows when there are fewer)."""
        return 2 * self.size < min(self.setting, self.rows)

    def text(self) -> str:
        return (
            f"{self.key}={self.setting}: {self.rows} rows per update split into mini-batches of {self.size} rows (the "
            f"largest size <= {self.setting} that divides the rows evenly over the {self.ranks} data-parallel ranks): "
            f"{self.rows // self.size} optimizer steps per update"
        )


def mini_batch_keys(config: DictConfig, level: str) -> dict[str, str]:
    """The mini-batch size keys of ``level``'s optimizers (its policy's, and its critic's when it has verl's), each
    with its path in the level's view (:func:`~agent_system.config.level_view`)."""
    keys = {f"{POLICY_TREES[level]}.actor.ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size"}
    if critic_name(config, level) == CRITIC_TREES[level]:
        keys[f"{CRITIC_TREES[level]}.ppo_mini_batch_size"] = "critic.ppo_mini_batch_size"
    return keys


def mini_batch_cuts(config: DictConfig) -> list[MiniBatchCut]:
    """Each optimizer of a trained level whose mini-batch size is cut to a divisor of its (padded) rows."""
    found = []
    frozen = frozen_levels(config)
    for level in ("ll", "hl"):
        if frozen[level]:
            continue
        world = level_world_size(config, level)
        rows = -(-level_rows(config, level) // world) * world  # padded to the data-parallel size
        # read in the level's own view (as its workers get it): the HL critic's default names actor_rollout_ref
        view = level_view(config, level)
        for key, in_view in mini_batch_keys(config, level).items():
            setting = int(OmegaConf.select(view, in_view))
            size = mini_batch_size(rows, setting, world)
            if size < min(setting, rows):
                found.append(MiniBatchCut(key, setting, size, rows, world))
    return found


def refuse_small_mini_batches(config: DictConfig) -> None:
    """Refuse a mini-batch cut below half its setting (issue 34: ArCHer's 128 rows on 3 ranks, padded to 129, made 43
    optimizer steps of 3 rows per update where its setting asked for one of 128), unless
    ``mlmt.allow_small_mini_batches=true``; a smaller cut stays a notice of the run plan (:func:`mini_batch_cuts`).
    Called with the config checks, before any worker starts (``main.prepare_config``)."""
    if config.mlmt.allow_small_mini_batches:
        return
    cuts = [cut for cut in mini_batch_cuts(config) if cut.below_half]
    if cuts:
        raise ConfigError(
            "; ".join(
                f"{cut.rows} rows per update (data.train_batch_size × mlmt.n × turns, padded to a multiple of "
                f"{cut.ranks} data-parallel ranks) with {cut.key}={cut.setting}: the effective mini-batch is "
                f"{cut.size} rows ({cut.rows // cut.size} optimizer steps per update), below half the setting"
                for cut in cuts
            )
            + ": make the rows a multiple of the ranks times a size near the setting (data.train_batch_size, the "
            "level's devices) or lower the setting, or set mlmt.allow_small_mini_batches=true to run it anyway"
        )


# ------------------------------------------------------------------------------------------------------ the plan
LEAK_CHECKS = ["the rules (leak.py, rules 1-8)", "value presence (value_presence.py)"]
LEAK_JUDGE_CHECK = "the leak judge (mlmt.reward.leak_judge; the rules where it fails)"
LEAK_READER_CHECK = (
    "the reader test (the LL's reference model, training steps only: a gain >= {threshold:g} nats leaks, "
    "train/leak_reader_rate)"
)


def leak_plan(config: DictConfig, train_sources: list[str] | None) -> LeakPlan:
    """The leak checks a run has: every HL feedback of a math row is checked (code and YAML task rows: not
    applicable), and ``mlmt.reward.leak_penalty`` acts where a trained HL has a math training row.

    Args:
        train_sources: The training rows' ``data_source`` (None: not read; the rows' kinds are then not given).
    """
    kinds: dict[str, int] | None = None
    if train_sources is not None:
        kinds = {}
        for source, count in sorted(Counter(str(s) for s in train_sources).items()):
            try:
                kind = task_kind(source)
            except ValueError:
                kind = "unknown"
            kinds[kind] = kinds.get(kind, 0) + count
        kinds = dict(sorted(kinds.items()))
    reward, hl = config.mlmt.reward, config.mlmt.feedback == "model"
    penalty = float(reward.get("leak_penalty", 0.0) or 0.0)
    idle = ""
    if penalty > 0:
        frozen = frozen_reasons(config)["hl"]
        if not hl:
            idle = f"no HL (mlmt.feedback={config.mlmt.feedback})"
        elif frozen:
            idle = f"the HL never trains ({frozen})"
        elif reward.hl_reward == "value_shaped":
            idle = "the HL's reward is value_shaped's (mlmt.reward.hl_reward=value_shaped)"
        elif kinds is not None and not kinds.get("math", 0):
            idle = "no training row is a math task (MBPP and YAML task feedbacks are not checked)"
    judge = reward.leak_judge  # start-up refuses a half-set one (judge.trainer_leak_judge); never the key
    named = {"model": str(judge.model), "base_url": str(judge.base_url)} if hl and judge.model else {}
    checks = [*LEAK_CHECKS, *([LEAK_JUDGE_CHECK] if named else [])] if hl else []
    if reader_on(config):  # mlmt.reward.leak_reader: auto where the LL has a reference (methods/leak_reader)
        checks.append(LEAK_READER_CHECK.format(threshold=float(reward.leak_reader_threshold)))
    return LeakPlan(
        feedback=str(config.mlmt.feedback),
        checks=checks,
        train_rows=kinds,
        penalty=penalty,
        penalty_acts=penalty > 0 and not idle,
        penalty_idle=idle,
        confidence_lambda=float(reward.get("confidence_lambda", 0.0) or 0.0) if hl else 0.0,
        judge=named,
    )


def render_leak(leak: LeakPlan) -> list[str]:
    """The plan page's leak section."""
    lines = ["## Leak check (docs/LEAK.md)"]
    if not leak.checks:
        return [*lines, f"- off: no HL feedback to check (mlmt.feedback={leak.feedback})"]
    rows = leak.train_rows
    if rows is None:
        checked = "math rows only (the training rows' sources not read)"
    else:
        by_kind = ", ".join(f"{kind} {count}" for kind, count in rows.items())
        checked = f"{rows.get('math', 0)} of {sum(rows.values())} training rows ({by_kind})"
    lines += [
        f"- checks: {' + '.join(leak.checks)}, on every HL feedback of a math row, each training step and validation "
        "(train/leak_rate, val/leak_rate)",
        f"- rows checked: {checked}; code (MBPP) and YAML task rows: not applicable, not checked",
    ]
    if leak.judge:
        lines.append(
            f"- leak judge: `{leak.judge['model']}` at {leak.judge['base_url']} (mlmt.reward.leak_judge) adds the "
            "leaks it finds to those of the rules and value presence (its NO clears none; where it errs, times out or "
            "answers neither YES nor NO, the rules' verdict alone) (train/leak_judge_decided, leak_judge_added, "
            "leak_judge_disputed, leak_judge_fallbacks, leak_rate_rules)"
        )
    if leak.penalty <= 0:
        lines.append("- penalty: off (mlmt.reward.leak_penalty=0): leaks are measured, not in the HL's reward")
    elif leak.penalty_acts:
        lines.append(
            f"- penalty: {leak.penalty:g} off the HL reward of each leaking feedback (mlmt.reward.leak_penalty)"
        )
    else:
        lines.append(f"- penalty: {leak.penalty:g} NEVER ACTS: {leak.penalty_idle}; start-up refuses it")
    if leak.confidence_lambda > 0:
        lines.append(
            f"- confidence term (confidence_lambda={leak.confidence_lambda:g}): it pays for feedback that makes the "
            "reference solution likelier; the check reads the gold's value, not quoted steps of the reference "
            '(docs/LEAK.md, "The confidence term and quoting")'
        )
    return lines


def build_plan(
    config: DictConfig, train_rows: int, val_rows: int | None, train_sources: list[str] | None = None
) -> RunPlan:
    """The plan of the run ``config`` describes, with ``train_rows`` training and ``val_rows`` validation problems
    (``train_sources``: the training rows' ``data_source``, for the leak check's rows; None: not given).

    Call it after ``main.set_schedule_horizon`` (the optimizers' horizons are read from ``config``).
    """
    from agent_system.config import reference_in_actor, reference_needed

    mlmt, data = config.mlmt, config.data
    total = run_steps(config, train_rows)
    steps = level_update_steps(config, total)
    frozen = frozen_levels(config)
    use_ref, base_ref = reference_needed(config), reference_in_actor(config)
    attempts = data.train_batch_size * mlmt.n
    refinements = attempts * mlmt.m if mlmt.feedback != "none" else 0
    reward = mlmt.reward
    contrastive = mlmt.feedback == "model" and reward.hl_reward == "contrastive"
    snapshot = refinements if contrastive and reward.contrastive_reference == "lagged_snapshot" else 0
    no_feedback = attempts if contrastive and reward.contrastive_reference == "no_feedback" else 0
    samples = {
        "ll": attempts + refinements + no_feedback + snapshot,
        "hl": refinements if mlmt.feedback == "model" else 0,
    }
    levels = {}
    for level in ("ll", "hl") if mlmt.feedback == "model" else ("ll",):
        tree = config[POLICY_TREES[level]]
        world = level_world_size(config, level)
        rows = level_rows(config, level)
        padded = -(-rows // world) * world
        mini = mini_batch_size(padded, tree.actor.ppo_mini_batch_size, world)
        response = data.max_response_length if level == "ll" else tree.rollout.response_length
        count = len(steps[level])
        sections = optimizer_sections(config, level)
        if use_ref[level]:
            if base_ref[level]:
                reference = "the base model: the actor with its LoRA adapter switched off (no second copy)"
                loaded = tree.model.get("lora_adapter_path")
                if loaded:
                    reference += f"; not the loaded adapter {loaded}, which the actor starts from"
            else:
                reference = "initial weights" + (
                    f", refreshed from the actor every {mlmt.ll.ref_refresh_freq} steps"
                    if level == "ll" and mlmt.ll.ref_refresh_freq
                    else ""
                )
            reference += f" (β·KL in the {mlmt.stages.kl_in})"
        else:
            reference = "none (no β > 0 and no actor.use_kl_loss)"
        parameters, trainable, tuning = level_trainable(config, level, frozen[level])
        levels[level] = LevelPlan(
            level=level,
            model=str(tree.model.path),
            frozen=frozen[level],
            parameters=parameters,
            trainable_parameters=trainable,
            estimator=str(mlmt[level].adv_estimator),
            tuning=tuning,
            update_steps=steps[level],
            updates=count,
            update_steps_text=compress_steps(steps[level]),
            lr=None if frozen[level] else lr_plan(config, sections[0], count),
            reference=reference,
            critic=critic_name(config, level),
            critic_lr=lr_plan(config, sections[1], count) if len(sections) > 1 and not frozen[level] else None,
            rows_per_update=rows,
            world_size=world,
            prompt_tokens=int(data.max_prompt_length),
            response_tokens=int(response),
            tokens_per_row=int(data.max_prompt_length + response),
            tokens_per_step=int(rows * (data.max_prompt_length + response)),
            mini_batch_setting=int(tree.actor.ppo_mini_batch_size),
            mini_batch=mini,
            optimizer_steps_per_update=padded // mini * int(tree.actor.ppo_epochs),
            samples_per_step=samples[level],
        )
    stages = []
    schedule = list(mlmt.stages.schedule)
    for i, start in enumerate(schedule):
        first = max(int(start), 1)
        last = (int(schedule[i + 1]) - 1) if i + 1 < len(schedule) else total
        last = min(last, total)
        stage_id = int(mlmt.stages.stage_ids[i])
        stages.append(
            StagePlan(
                index=i,
                stage_id=stage_id,
                first_step=first,
                last_step=last,
                reached=first <= last,
                beta_turn1=float(mlmt.stages.beta_turn1[i]),
                beta_turn2=float(mlmt.stages.beta_turn2[i]),
                beta_turn3=float(mlmt.stages.beta_turn3[i]),
                alpha=float(mlmt.stages.alpha[i]) if stage_id == 2 else 0.0,
                turn1_task_reward=stage_id == 2,
            )
        )
    validations = _due_steps(config.trainer.test_freq, total) if val_rows else []
    if val_rows and config.trainer.val_before_train:
        validations = [0, *validations]
    val_samples = (val_rows or 0) * (1 + (2 if mlmt.feedback == "model" else 1 if mlmt.feedback == "self" else 0))
    notices = [cut.text() for cut in mini_batch_cuts(config)]  # below half: refused unless allowed (config.py)
    leak = leak_plan(config, train_sources)
    if leak.penalty_idle:  # start-up refuses it once the rows are read (methods/leak_penalty); a plan only says so
        notices.append(f"mlmt.reward.leak_penalty={leak.penalty:g} never acts: {leak.penalty_idle}")
    idle = idle_devices_notice(config, visible_gpus())
    notices += [idle] if idle else []
    device, device_source = device_memory(config)
    memory, memory_unavailable = None, ""
    try:
        copies = {level: use_ref[level] and not base_ref[level] for level in use_ref}
        memory = memory_plan(config, device, device_source, copies)
    except MemoryUnavailable as error:
        memory_unavailable = str(error)
    return RunPlan(
        total_steps=total,
        steps_from=steps_source(config, train_rows),
        schedule=f"(tH, tL) = ({mlmt.schedule.tH}, {mlmt.schedule.tL})",
        levels=levels,
        stages=stages,
        checkpoint_steps=_due_steps(config.trainer.save_freq, total),
        validation_steps=validations,
        samples_per_step=sum(level.samples_per_step for level in levels.values()),
        samples_per_validation=val_samples,
        notices=notices + (memory.notices if memory else []),
        memory=memory,
        memory_unavailable=memory_unavailable,
        plugins=methods.plugin_names(config),
        device=plan_target(config),
        leak=leak,
    )


def _lr_text(lr: LrPlan | None) -> str:
    if lr is None:
        return "frozen: no optimizer steps"
    text = (
        f"{lr.scheduler}, horizon {lr.horizon} updates, warm-up {lr.warmup_updates}: first {lr.first:.3g}, "
        f"peak {lr.peak:.3g} (update {lr.peak_update}), last {lr.last:.3g} (setting {lr.setting:.3g})"
    )
    return text if lr.completed else text + " — SCHEDULE NOT COMPLETED (horizon set by the user?)"


def _trainable_text(level: LevelPlan) -> str:
    if level.parameters is None:
        return level.tuning
    if level.frozen:
        return f"none of {level.parameters:,} (frozen; {level.tuning})"
    share = 100 * level.trainable_parameters / level.parameters
    return f"{level.trainable_parameters:,} of {level.parameters:,} ({share:.3g} %, {level.tuning})"


def render_markdown(plan: RunPlan) -> str:
    """The plan as a short Markdown page (also what is logged)."""
    lines = [
        "# Run plan",
        "",
        f"- planned for: {plan.device}",
        f"- steps: {plan.total_steps} ({plan.steps_from}); schedule {plan.schedule}",
        f"- checkpoints at steps: {compress_steps(plan.checkpoint_steps)}",
        f"- validations at steps: {compress_steps(plan.validation_steps)}"
        + (f" ({plan.samples_per_validation} generations each)" if plan.validation_steps else ""),
        f"- generations per training step: {plan.samples_per_step}",
        f"- plug-ins (mlmt.plugins): {', '.join(plan.plugins) or 'none'}",
        "",
    ]
    for level in plan.levels.values():
        lines += [
            f"## {level.level.upper()} ({level.model}){' — FROZEN' if level.frozen else ''}",
            f"- updated on {level.updates} steps: {level.update_steps_text}",
            f"- estimator: {level.estimator} (mlmt.{level.level}.adv_estimator)",
            f"- trainable parameters: {_trainable_text(level)}",
            f"- lr: {_lr_text(level.lr)}",
            f"- reference: {level.reference}",
            f"- critic: {level.critic}" + (f"; lr: {_lr_text(level.critic_lr)}" if level.critic_lr else ""),
            f"- rows per update: {level.rows_per_update} on {level.world_size} data-parallel rank(s); up to "
            f"{level.tokens_per_row} tokens per row, {level.tokens_per_step} per update",
            f"- mini-batch: {level.mini_batch} rows (setting {level.mini_batch_setting}), "
            f"{level.optimizer_steps_per_update} optimizer step(s) per update",
            f"- generations per step: {level.samples_per_step}",
            "",
        ]
    lines.append("## Stages")
    for stage in plan.stages:
        period = f"steps {stage.first_step}-{stage.last_step}" if stage.reached else "NEVER REACHED"
        lines.append(
            f"- stage {stage.index} (SCoRe stage {'I' if stage.stage_id == 1 else 'II'}), {period}: turn 1 "
            f"{f'R1 + α {stage.alpha}·(R̄3 − R1)' if stage.turn1_task_reward else 'no task reward'} − β "
            f"{stage.beta_turn1}·KL; turn 2 feedback − β "
            f"{stage.beta_turn2}·KL; turn 3 R3 + α {stage.alpha}·(R3 − R1) − β {stage.beta_turn3}·KL"
        )
    if plan.leak is not None:
        lines += ["", *render_leak(plan.leak)]
    lines += [
        "",
        *(
            render_memory(plan.memory)
            if plan.memory
            else ["## GPU memory", f"- not estimated: {plan.memory_unavailable}"]
        ),
    ]
    if plan.notices:
        lines += ["", "## Notices", *[f"- {notice}" for notice in plan.notices]]
    return "\n".join(lines) + "\n"


def write_plan(plan: RunPlan, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``run_plan.json`` and ``run_plan.md`` in ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / PLAN_JSON, out / PLAN_MD
    json_path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    md_path.write_text(render_markdown(plan))
    return json_path, md_path


def read_plan(out_dir: str | Path) -> dict:
    return json.loads((Path(out_dir) / PLAN_JSON).read_text())


# ------------------------------------------------------------------------------------------------------ the check
def _reported_lr(record: dict, level: str, critic: bool) -> float | None:
    key = f"{level}/critic/lr" if critic else f"{level}/lr"
    value = record.get(key)
    return None if value is None else float(value)


def plan_differences(plan: RunPlan, config: DictConfig, history: list[dict], last_step: int) -> list[str]:
    """Differences between ``plan`` and the run's step records (``{"step", "<level>/updated", "train/stage_index",
    "<level>/lr", ...}``) up to ``last_step`` (the plan's last step unless the run was stopped early)."""
    differences = []
    records = {int(record["step"]): record for record in history if record.get("step", 0) >= 1}
    missing = [step for step in range(1, last_step + 1) if step not in records]
    if missing:
        differences.append(f"no record of steps {compress_steps(missing)}")
    # Steps resumed from a checkpoint written before run plans existed carry no stage / update records: the check
    # starts after the last of them (said in the log), and the updates before it are taken as planned.
    unplanned = [step for step in sorted(records) if "train/stage_index" not in records[step]]
    first = unplanned[-1] + 1 if unplanned else 1
    if unplanned:
        logger.warning(
            "steps %s come from a checkpoint written before run plans: the plan is checked on steps %d-%d only",
            compress_steps(unplanned),
            first,
            last_step,
        )
    frozen = frozen_levels(config)
    for level, level_plan in plan.levels.items():
        planned = [s for s in level_plan.update_steps if first <= s <= last_step]
        done = [s for s in sorted(records) if first <= s <= last_step and records[s].get(f"{level}/updated")]
        if done != planned:
            differences.append(
                f"{level}: planned {len(planned)} updates ({compress_steps(planned)}), the run made {len(done)} "
                f"({compress_steps(done)})"
            )
            continue
        if not done or frozen[level]:
            continue
        updates = len([s for s in level_plan.update_steps if s <= last_step])  # the pre-plan ones included
        for lr, critic in ((level_plan.lr, False), (level_plan.critic_lr, True)):
            if lr is None:
                continue
            expected = lr_after(config, lr.section, updates)
            reported = _reported_lr(records[done[-1]], level, critic)
            if reported is None:
                differences.append(f"{level}: verl reported no lr at its last update (step {done[-1]}, {lr.section})")
            elif not math.isclose(reported, expected, rel_tol=LR_TOLERANCE, abs_tol=1e-15):
                differences.append(
                    f"{level}: {lr.section} lr after the last update (step {done[-1]}, update {updates}) is "
                    f"{reported:.6g}, the plan's {expected:.6g}"
                )
            if len(done) >= 2 and updates == len(level_plan.update_steps):  # the lr the last update used
                used = _reported_lr(records[done[-2]], level, critic)
                if used is not None and not math.isclose(used, lr.last, rel_tol=LR_TOLERANCE, abs_tol=1e-15):
                    differences.append(
                        f"{level}: {lr.section} lr of the last update is {used:.6g}, the plan's {lr.last:.6g}"
                    )
    wrong_stage = [
        step
        for step in sorted(records)
        if step <= last_step
        and "train/stage_index" in records[step]
        and int(records[step]["train/stage_index"]) != plan.stage_index_at(step)
    ]
    if wrong_stage:
        differences.append(f"stages: steps {compress_steps(wrong_stage)} ran another stage than the plan's")
    return differences


def check_run(plan: RunPlan, config: DictConfig, history: list[dict], last_step: int) -> None:
    """Raise :class:`PlanMismatch` naming every difference between ``plan`` and the run's history."""
    differences = plan_differences(plan, config, history, last_step)
    if differences:
        raise PlanMismatch("the run did not follow its plan (run_plan.json): " + "; ".join(differences))
    logger.info("run plan checked: updates per level, stages and the last lr match the run up to step %d", last_step)
