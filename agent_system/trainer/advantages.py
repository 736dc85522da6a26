"""Per-turn task rewards (docs/METHOD.md, "Turns and rewards"), their GRPO group keys (docs/METHOD.md, "Groups and
advantages"), advantages from the estimator registries, and the β·KL terms applied after the estimator.

A method adds an estimator with verl's ``register_adv_est`` (critic-free) or :func:`register_value_estimator` (reads a
value per token), and a level's reward with :func:`register_task_reward` (docs/EXTENDING.md).

Pure functions over tensors and lists: unit-tested without Ray.

Task rewards, placed on the last response token of each row and turned into advantages by the level's estimator,
run on each turn's rows on their own (group-normalised for grpo; whitened per turn for reinforce_plus_plus and gae).
In stage I the turn-1 rows get no task advantage under any estimator (with gae the critic's values would otherwise
give them one), only their β·KL term:

    turn 1 (LL)   stage I: 0                      stage II: R1 + α(R̄3 − R1)  (R̄3: the attempt's mean R3)
    turn 3 (LL)   stage I: R3                     stage II: R3 + α(R3 − R1)
    turn 2 (HL)   S2,  S2 = R3 | R3 + α(R3 − R1) (stage II only) | (1+λ)R3 − λ·R_ref   (+ optional confidence term)

KL terms, one β per turn and stage (``kl_coefficients``): ``mlmt.stages.beta_turn1`` (SCoRe's β2 in a stage I, β1 in
a stage II), ``beta_turn3`` (the solver's refinement) and ``beta_turn2`` (the HL's feedback).

``mlmt.stages.kl_in`` chooses where β·KL acts, in both cases proportionally to β whatever the group's reward spread:

* ``loss`` (default): each row carries its β to the actor, whose loss adds β·kl per token (``turn_kl.py``); the
  advantages are the task advantages alone.
* ``advantage``: β·(KL − b) is subtracted from every response token's advantage **after** the estimator (KL = Σ_t
  (log π − log π_ref) over the row's response, b the leave-one-out mean KL of the same turn's other rows, a
  baseline). Since ∇ E[KL(y)] = E[KL(y) ∇ log π(y)] (plus a zero-mean term), −β·KL(y) as a per-row advantage is the
  REINFORCE gradient of −β·KL(π ‖ π_ref): unbiased, but with tens of rows its noise can hide the pull (README).

Groups (nested, so GRPO is meaningful at both levels): turn-1 rows by problem; turn-3 rows by problem (or by
attempt); HL rows by the attempt they critique (the m feedbacks on one z).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from agent_system.config import LEVELS, frozen_levels
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores


@dataclass(frozen=True)
class Stage:
    """Coefficients of the active stage: the β of each turn's rows and the stage-II progress bonus α."""

    stage_id: int
    beta_turn1: float
    beta_turn2: float
    beta_turn3: float
    alpha: float
    returns: str = "progress"  # mlmt.stages.returns: how α enters the stage-II returns (turn1/turn3_task_rewards)


def stage_at(stages_config, step: int) -> tuple[int, Stage]:
    """Index and coefficients of the stage active at 1-based training ``step``.

    Stage i is active from global step ``schedule[i]`` on (the original switches at ``global_step == step``):
    with ``schedule: [0, 3]`` steps 1-2 run stage 0 and step 3 runs stage 1.
    """
    index = max(i for i, start in enumerate(stages_config.schedule) if start <= step)
    return index, Stage(
        stage_id=int(stages_config.stage_ids[index]),
        beta_turn1=float(stages_config.beta_turn1[index]),
        beta_turn2=float(stages_config.beta_turn2[index]),
        beta_turn3=float(stages_config.beta_turn3[index]),
        alpha=float(stages_config.alpha[index]),
        returns=str(stages_config.get("returns", Stage.returns)),  # a stages section written without it: the default
    )


def turn1_task_rewards(r1: np.ndarray, r3_mean: np.ndarray, stage: Stage) -> np.ndarray:
    """Turn-1 task reward: none in stage I (the turn only gets its −β·KL); in stage II R1 plus the progress bonus
    α(R̄3 − R1), ``r3_mean`` = R̄3 the mean R3 of the attempt's refinements; with ``mlmt.stages.returns=score``
    SCoRe's episode return (1 − α)R1 + (1 + α)R̄3.

    As in SCoRe, whose stage-II bonus is credited to the first attempt's tokens too: the attempt is the only action
    the −αR1 part can act on (on turn 3 R1 is part of the state, so −αR1 has zero expected gradient there;
    docs/METHOD.md, "The progress bonus").
    """
    if stage.stage_id == 1:
        return np.zeros_like(r1, dtype=np.float64)
    r3_mean = np.asarray(r3_mean, dtype=np.float64)
    if stage.returns == "score":  # SCoRe's episode return, credited to the first attempt too
        return (1 - stage.alpha) * r1 + (1 + stage.alpha) * r3_mean
    return r1 + stage.alpha * (r3_mean - r1)


def turn3_task_rewards(r1_of_attempt: np.ndarray, r3: np.ndarray, stage: Stage) -> np.ndarray:
    """Turn-3 task reward: R3, plus the progress bonus α(R3 − R1) in stage II (a (1 + α) scale of R3 in expectation:
    R1 is fixed in the turn-3 state). With ``returns=score``, SCoRe's stage-II episode return (1 − α)R1 + (1 + α)R3
    (Kumar et al. 2024: R1 + R2 + α(R2 − R1)), the same expected gradient with R1 in the return."""
    reward = r3.astype(np.float64)
    if stage.stage_id == 2 and stage.returns == "score":
        return (1 - stage.alpha) * r1_of_attempt + (1 + stage.alpha) * reward
    if stage.stage_id == 2:
        reward = reward + stage.alpha * (r3 - r1_of_attempt)
    return reward


def kl_coefficients(turn: np.ndarray, stage: Stage) -> np.ndarray:
    """β of each row: its turn's β in the stage."""
    betas = {1: stage.beta_turn1, 2: stage.beta_turn2, 3: stage.beta_turn3}
    return np.array([betas[int(t)] for t in turn], dtype=np.float64)


def apply_kl_penalty(
    advantages: torch.Tensor, kl: np.ndarray, betas: np.ndarray, response_mask: torch.Tensor, turn=None
) -> tuple[torch.Tensor, np.ndarray]:
    """Subtract β·(KL − b) of each row from every response token's advantage, after the estimator.

    b is the leave-one-out mean KL of the other rows of the same turn in the batch: a baseline, so the expected
    gradient is still that of −β·KL(π ‖ π_ref) (module docstring) while the variance of a raw sequence KL (tens of
    nats, the same sign on every row) is removed. A turn with a single row keeps its raw KL.

    Args:
        advantages: (B, R) advantages of the task rewards.
        kl: (B,) sequence KL of each row to the reference.
        betas: (B,) KL coefficient of each row.
        response_mask: (B, R).
        turn: (B,) turn of each row (rows of one turn share a baseline); None: one set.

    Returns:
        The shaped advantages (B, R) and the per-row penalty β·(KL − b) (B,).
    """
    kl = np.asarray(kl, dtype=np.float64)
    turn = np.zeros(len(kl), dtype=int) if turn is None else np.asarray(turn)
    centred = kl.copy()
    for value in np.unique(turn):
        rows = turn == value
        count = int(rows.sum())
        if count > 1:
            centred[rows] = kl[rows] - (kl[rows].sum() - kl[rows]) / (count - 1)
    penalty = betas * centred
    shaped = advantages - torch.as_tensor(penalty, dtype=advantages.dtype)[:, None] * response_mask.to(advantages.dtype)
    return shaped, penalty


def hl_scores(
    r1_of_attempt: np.ndarray,
    r3: np.ndarray,
    mode: str,
    stage: Stage,
    contrastive_lambda: float,
    r_ref: np.ndarray | None,
) -> np.ndarray:
    """S2, the HL's task score for each feedback.

    ``progress`` adds α(R3 − R1) in stage II only (as on turn 3). ``contrastive`` needs ``r_ref``, the reference
    solver's score for each feedback row (a lagged LL snapshot refining from the same prompt) or for its attempt
    (the LL's refinement with no feedback).
    """
    if mode == "r3":
        return r3.astype(np.float64)
    if mode == "progress":
        if stage.stage_id != 2:
            return r3.astype(np.float64)
        return r3 + stage.alpha * (r3 - r1_of_attempt)
    if mode == "contrastive":
        if r_ref is None:
            raise ValueError("hl_reward=contrastive needs the reference refinements' scores (R_ref)")
        return (1 + contrastive_lambda) * r3 - contrastive_lambda * r_ref
    raise ValueError(f"unknown hl_reward {mode!r}")


def group_keys(problem: list[int], attempt: list[int], turn: list[int], turn3_group_by: str) -> np.ndarray:
    """GRPO group key of each row (see the module docstring)."""
    keys = []
    for p, a, t in zip(problem, attempt, turn, strict=True):
        if t == 1:
            keys.append(f"p{p}/t1")
        elif t == 2:
            keys.append(f"p{p}/a{a}/t2")
        elif turn3_group_by == "attempt":
            keys.append(f"p{p}/a{a}/t3")
        else:
            keys.append(f"p{p}/t3")
    return np.array(keys, dtype=object)


def place_on_last_token(rewards: np.ndarray, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) scalar rewards -> (B, R) token-level rewards with the value on each row's last response token."""
    token_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = response_mask.sum(dim=1).long() - 1  # (B,)
    token_rewards[torch.arange(len(last)), last.clamp(min=0)] = torch.as_tensor(rewards, dtype=torch.float32)
    return token_rewards


# verl's estimators this trainer calls as they are (``compute_advantages``); others are added by registering
VERL_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus")
CRITIC_FREE: list[str] = []  # the names registered with register_estimator


def register_estimator(name: str):
    """Register a critic-free estimator (with verl's ``register_adv_est``, which ``compute_advantages`` calls as
    ``fn(token_level_rewards, response_mask, index, config)``) and accept ``name`` as a level's ``adv_estimator``."""

    def wrap(fn):
        core_algos.register_adv_est(name)(fn)
        if name not in CRITIC_FREE:
            CRITIC_FREE.append(name)
        return fn

    return wrap


@register_estimator("reinforce")
def compute_reinforce_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE without a baseline: every response token's advantage is the row's return (γ = 1)."""
    returns = (token_level_rewards * response_mask).sum(dim=-1, keepdim=True) * response_mask
    return returns, returns


@dataclass(frozen=True)
class ValueEstimator:
    """An estimator that reads a value per response token (``LevelInputs.values``).

    ``fn(token_level_rewards, values, response_mask, config) -> (advantages, returns)``, each (N, R); ``critic``:
    whether the values are the level's verl critic's (built for the level, trained on ``returns``) rather than
    supplied by the method's own hook.
    """

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    critic: bool


VALUE_ESTIMATORS: dict[str, ValueEstimator] = {}


def register_value_estimator(name: str, critic: bool):
    """Register an estimator that reads values (critic-free ones: :func:`register_estimator`)."""

    def wrap(fn):
        known = VALUE_ESTIMATORS.get(name)
        if known is not None and known.fn is not fn:
            raise ValueError(f"value estimator {name!r} is already registered by {known.fn.__module__}")
        VALUE_ESTIMATORS[name] = ValueEstimator(fn, critic)
        return fn

    return wrap


def estimator_names() -> tuple[str, ...]:
    """The accepted values of ``mlmt.<level>.adv_estimator``: verl's built-ins and every registered estimator (the
    methods' and plug-ins' once imported: ``agent_system.methods.import_all``)."""
    return (*VERL_ESTIMATORS, *CRITIC_FREE, *VALUE_ESTIMATORS)


def needs_critic(estimator: str) -> bool:
    """Whether a level with this estimator gets a verl value model (its critic)."""
    return estimator in VALUE_ESTIMATORS and VALUE_ESTIMATORS[estimator].critic


def critic_levels(config) -> tuple[str, ...]:
    """The levels that get a value model (verl's critic): the one rule, read by the plan, the memory estimate, the
    model-path checks and the launcher. A level gets one when its estimator is registered with ``critic=True``
    (``gae``, or a method's) and it trains: a frozen level's advantages are never computed,
    so its critic would take memory and a folder in every checkpoint for nothing."""
    frozen = frozen_levels(config)
    return tuple(level for level in LEVELS if needs_critic(config.mlmt[level].adv_estimator) and not frozen[level])


@register_value_estimator("gae", critic=True)
def compute_gae(token_level_rewards, values, response_mask, config) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GAE (PPO) with ``config.gamma`` and ``config.lam``."""
    return core_algos.get_adv_estimator_fn("gae")(
        token_level_rewards=token_level_rewards,
        values=values,
        response_mask=response_mask,
        gamma=config.gamma,
        lam=config.lam,
    )


def compute_advantages(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, each (B, R), from the registered estimator ``estimator``.

    Estimators registered with :func:`register_value_estimator` (``gae`` and the methods' own) read ``values``
    (B, R); the others come from verl's registry (``register_adv_est``) and are critic-free. ``config`` is verl's
    ``algorithm`` section (gamma, lam, norm_adv_by_std_in_grpo).
    """
    if estimator in VALUE_ESTIMATORS:
        if values is None:
            raise ValueError(f"adv_estimator={estimator} needs the critic's values (one per response token)")
        return VALUE_ESTIMATORS[estimator].fn(token_level_rewards, values, response_mask, config)
    fn = core_algos.get_adv_estimator_fn(estimator)
    kwargs = {}
    if estimator == "grpo":  # verl reads this flag from the argument only, not from config
        kwargs["norm_adv_by_std_in_grpo"] = bool(config.get("norm_adv_by_std_in_grpo", True))
    return fn(
        token_level_rewards=token_level_rewards, response_mask=response_mask, index=index, config=config, **kwargs
    )


def per_turn_advantages(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config,
    turn: np.ndarray,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_advantages` run on each turn's rows on their own, so that no turn's rewards reach another's
    advantages.

    verl's ``reinforce_plus_plus`` and ``gae`` whiten over the whole batch: run on all LL rows at once, the turn-3
    rewards set the mean and scale of the turn-1 advantages (stage I, task rewards [0, 0, 1, 1, 1, 0] on turns
    [1, 1, 3, 3, 3, 3]: every turn-1 row got −0.98 where GRPO gives 0; stage II: turn 1 scaled by the spread of the
    α-shaped turn-3 rewards). Per turn, each turn is whitened over its own rows. GAE's TD returns are per row, so
    only its whitening changes; grpo/rloo groups never span turns and reinforce has no batch statistic, so they are
    unchanged.
    """
    turn = np.asarray(turn)
    advantages = torch.zeros(response_mask.shape, dtype=torch.float32)
    returns = torch.zeros(response_mask.shape, dtype=torch.float32)
    for value in np.unique(turn):
        rows = np.flatnonzero(turn == value)
        picked = torch.as_tensor(rows)
        part_advantages, part_returns = compute_advantages(
            estimator,
            token_level_rewards[picked],
            response_mask[picked],
            index[rows],
            config,
            None if values is None else values[picked],
        )
        advantages[picked] = part_advantages.to(advantages.dtype)
        returns[picked] = part_returns.to(returns.dtype)
    return advantages, returns


@dataclass
class LevelAdvantages:
    """What :func:`level_advantages` computes for one level's rows."""

    advantages: torch.Tensor  # (B, R) task advantages (minus β·KL with kl_in=advantage)
    returns: torch.Tensor  # (B, R) returns of the task rewards (the critic's targets with gae)
    task_rewards: np.ndarray  # (B,) per-row task reward before the estimator
    kl_penalty: np.ndarray  # (B,) β·KL subtracted from each row's advantages (zeros with kl_in=loss)
    kl_coef: np.ndarray  # (B,) β of each row's turn (the actor's KL-loss coefficient with kl_in=loss)
    r3_advantages: torch.Tensor | None  # HL only: the advantages S2 = R3 would give (how much S2 changes them)
    groups_with_signal: float  # share of the level's groups with a non-zero task advantage on some row


@dataclass(frozen=True)
class TaskReward:
    """A method's task reward for a level's rows, replacing the per-turn rewards of the module docstring.

    ``selects(level, mlmt) -> bool``: whether the config selects it for ``level``;
    ``rewards(rows, scores, stage, mlmt, inputs) -> (N,)``: the reward of each row (``inputs.features`` holds the
    per-row arrays the method's level hook measured).
    """

    name: str
    selects: Callable[[str, Any], bool]
    rewards: Callable[..., np.ndarray]
    hl_reward: bool  # a value of mlmt.reward.hl_reward


def hl_reward_names() -> tuple[str, ...]:
    """The accepted values of ``mlmt.reward.hl_reward``: the built-ins and the registered HL rewards."""
    return (*HL_REWARDS, *(name for name, reward in TASK_REWARDS.items() if reward.hl_reward))


TASK_REWARDS: dict[str, TaskReward] = {}


HL_REWARDS = ("r3", "progress", "contrastive")  # the built-in values of mlmt.reward.hl_reward (hl_scores)


def register_task_reward(name: str, selects: Callable[[str, Any], bool], hl_reward: bool = False):
    """Register a method's task reward (decorator over its ``rewards`` function); ``hl_reward``: ``name`` is also
    accepted as a value of ``mlmt.reward.hl_reward`` (:func:`hl_reward_names`)."""

    def wrap(fn):
        known = TASK_REWARDS.get(name)
        if known is not None and known.rewards is not fn:
            raise ValueError(f"task reward {name!r} is already registered by {known.rewards.__module__}")
        TASK_REWARDS[name] = TaskReward(name, selects, fn, hl_reward)
        return fn

    return wrap


def task_rewards(level: str, rows: RowKeys, scores: StepScores, stage: Stage, mlmt, inputs: LevelInputs) -> np.ndarray:
    """(N,) task reward of each row: a registered method's reward when the config selects one, else the per-turn
    rewards (turn 1/3: :func:`turn1_task_rewards` / :func:`turn3_task_rewards`; turn 2: :func:`hl_scores`); plus
    ``inputs.extra_reward``."""
    selected = [reward for reward in TASK_REWARDS.values() if reward.selects(level, mlmt)]
    if len(selected) > 1:
        raise ValueError(f"several task rewards selected for {level}: {[reward.name for reward in selected]}")
    r1 = scores.r1[rows.problem, rows.attempt]
    # mlmt.feedback=none: no turn 3 (r3 is (B, n, 0)); every row is a turn-1 row
    r3 = scores.r3[rows.problem, rows.attempt, rows.feedback] if scores.refinements else np.zeros(len(rows))
    r3_mean = scores.r3[rows.problem, rows.attempt].mean(axis=-1) if scores.refinements else np.zeros(len(rows))
    if selected:
        task = np.asarray(selected[0].rewards(rows, scores, stage, mlmt, inputs), dtype=np.float64)
    elif level == "ll":
        task = np.where(rows.turn == 1, turn1_task_rewards(r1, r3_mean, stage), turn3_task_rewards(r1, r3, stage))
    else:
        reward = mlmt.reward
        task = hl_scores(r1, r3, reward.hl_reward, stage, reward.contrastive_lambda, scores.r_ref_of(rows))
    if inputs.extra_reward is not None:
        task = task + inputs.extra_reward
    return task


def level_advantages(
    *, level: str, rows: RowKeys, scores: StepScores, stage: Stage, mlmt, algorithm, inputs: LevelInputs
) -> LevelAdvantages:
    """Task rewards → the level's estimator over its groups (→ minus β·KL with ``kl_in=advantage``): the advantages
    the level is updated with, and each row's β.

    Args:
        level: "ll" (turn-1 and turn-3 rows) or "hl" (turn-2 rows).
        rows: where each of the N rows comes from.
        scores: the step's rewards.
        stage: the active stage's coefficients.
        mlmt: the ``mlmt`` config section (estimators, grouping, HL reward).
        algorithm: verl's ``algorithm`` section.
        inputs: the rows' KL, response mask (N, R), values and extra reward.
    """
    turn, response_mask = rows.turn, inputs.response_mask
    task = task_rewards(level, rows, scores, stage, mlmt, inputs)
    index = group_keys(rows.problem.tolist(), rows.attempt.tolist(), turn.tolist(), mlmt.ll.turn3_group_by)
    estimator = mlmt[level].adv_estimator

    def estimate(rewards: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        token_rewards = place_on_last_token(rewards, response_mask)
        return per_turn_advantages(estimator, token_rewards, response_mask, index, algorithm, turn, inputs.values)

    advantages, returns = estimate(task)
    if level == "ll" and stage.stage_id == 1:  # stage I: turn 1 has no task reward, only its β·KL term
        advantages = advantages * torch.as_tensor(turn != 1, dtype=advantages.dtype)[:, None]
    signal = groups_with_signal(advantages, response_mask, index)
    r3_advantages = None
    if level == "hl":
        r3_advantages = estimate(scores.r3[rows.problem, rows.attempt, rows.feedback].astype(np.float64))[0]
    betas = kl_coefficients(turn, stage)
    if mlmt.stages.kl_in == "advantage":
        advantages, penalty = apply_kl_penalty(advantages, inputs.kl, betas, response_mask, turn)
    else:
        penalty = np.zeros(len(betas))
    return LevelAdvantages(advantages, returns, task, penalty, betas, r3_advantages, signal)


def groups_with_signal(advantages: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray) -> float:
    """The share of groups (rows with one ``index`` key) in which some row has a non-zero advantage on a response
    token: the groups the update learns from. A group whose rows were all scored alike (all right, all wrong) has
    none under GRPO."""
    moved = ((advantages.abs() * response_mask) > 0).any(dim=-1).numpy()  # (B,)
    keys = np.asarray(index)
    groups = np.unique(keys)
    return float(np.mean([moved[keys == key].any() for key in groups])) if len(groups) else 0.0


def estimator_contract_error(level: str, mlmt, algorithm) -> str | None:
    """What is wrong with ``mlmt.<level>.adv_estimator`` when called as the trainer calls it, on a synthetic batch of
    the run's nested groups (2 problems × n attempts × m feedbacks, rows of different lengths, rewards 0/1, random
    values for an estimator that reads them): None, or a one-line message. Run before any worker starts, so a
    plug-in's shape bug shows in seconds instead of after the first rollouts."""
    estimator = mlmt[level].adv_estimator
    n, m = int(mlmt.n), max(int(mlmt.m), 1)
    keys = []  # (problem, attempt, turn) of each row: an LL attempt and its m refinements, or an HL's m feedbacks
    for p in range(2):
        for a in range(n):
            keys += [(p, a, 1), *[(p, a, 3)] * m] if level == "ll" else [(p, a, 2)] * m
    problem, attempt, turn = (list(column) for column in zip(*keys, strict=True))
    rows, length = len(turn), 6
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[::2, length // 2 :] = 0  # rows of different lengths
    rng = np.random.default_rng(0)
    rewards = place_on_last_token(rng.integers(0, 2, rows).astype(np.float64), mask)
    index = group_keys(problem, attempt, turn, mlmt.ll.turn3_group_by)
    values = torch.as_tensor(rng.normal(size=(rows, length)), dtype=torch.float32) * mask
    what = f"mlmt.{level}.adv_estimator={estimator} on a synthetic batch of {rows} rows × {length} tokens"
    for value in sorted(set(turn)):  # called once per turn, as per_turn_advantages calls it
        picked = torch.as_tensor([i for i, t in enumerate(turn) if t == value])
        part_mask, keys = mask[picked], index[picked.numpy()]
        try:
            result = compute_advantages(estimator, rewards[picked], part_mask, keys, algorithm, values[picked])
            shapes = [tuple(part.shape) for part in result]
        except Exception as error:  # a plug-in's bug, whatever it is, named with the estimator
            return f"{what} raised {type(error).__name__} on the turn-{value} rows: {error}"
        if len(shapes) != 2 or any(shape != tuple(part_mask.shape) for shape in shapes):
            return (
                f"{what} returned shapes {shapes} for the {len(picked)} turn-{value} rows; an estimator returns "
                f"(advantages, returns), each (rows, tokens) = {tuple(part_mask.shape)}"
            )
        if not all(bool(torch.isfinite(part[part_mask.bool()]).all()) for part in result):
            return f"{what} returned a non-finite advantage or return on a turn-{value} response token"
    return None
