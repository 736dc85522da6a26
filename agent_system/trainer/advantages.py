"""Per-turn task rewards (DESIGN.md §5), their GRPO group keys, advantages from verl's estimator registry, and the
β·KL terms applied after the estimator.

Pure functions over tensors and lists: unit-tested without Ray.

Task rewards, placed on the last response token of each row and turned into advantages by the level's estimator,
run on each turn's rows on their own (group-normalised for grpo; whitened per turn for reinforce_plus_plus and gae).
In stage I the turn-1 rows get no task advantage under any estimator (with gae the critic's values would otherwise
give them one), only their β2·KL term:

    turn 1 (LL)   stage I: 0                      stage II: R1
    turn 3 (LL)   stage I: R3                     stage II: R3 + α(R3 − R1)
    turn 2 (HL)   S2,  S2 = R3 | R3 + α(R3 − R1) (stage II only) | (1+λ)R3 − λ·R_ref   (+ optional confidence term)

KL terms, one β per turn (``kl_coefficients``):

    turn 1: stage I β2, stage II β1;   turn 3: β_L;   turn 2: β_H

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

from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from agent_system.trainer import value_shaping as vs


@dataclass(frozen=True)
class Stage:
    """Coefficients of the active stage."""

    stage_id: int
    beta1: float
    beta2: float
    beta_l: float
    beta_h: float
    alpha: float


def stage_at(stages_config, step: int) -> tuple[int, Stage]:
    """Index and coefficients of the stage active at 1-based training ``step``.

    Stage i is active from global step ``schedule[i]`` on (the original switches at ``global_step == step``):
    with ``schedule: [0, 3]`` steps 1-2 run stage 0 and step 3 runs stage 1.
    """
    index = max(i for i, start in enumerate(stages_config.schedule) if start <= step)
    return index, Stage(
        stage_id=int(stages_config.stage_ids[index]),
        beta1=float(stages_config.beta1[index]),
        beta2=float(stages_config.beta2[index]),
        beta_l=float(stages_config.beta_l[index]),
        beta_h=float(stages_config.beta_h[index]),
        alpha=float(stages_config.alpha[index]),
    )


def turn1_task_rewards(r1: np.ndarray, stage: Stage) -> np.ndarray:
    """Turn-1 task reward: none in stage I (the turn only gets −β2·KL), R1 in stage II."""
    if stage.stage_id == 1:
        return np.zeros_like(r1, dtype=np.float64)
    return r1.astype(np.float64)


def turn3_task_rewards(r1_of_attempt: np.ndarray, r3: np.ndarray, stage: Stage) -> np.ndarray:
    """Turn-3 task reward: R3, plus the progress bonus α(R3 − R1) in stage II."""
    reward = r3.astype(np.float64)
    if stage.stage_id == 2:
        reward = reward + stage.alpha * (r3 - r1_of_attempt)
    return reward


def kl_coefficients(turn: np.ndarray, stage: Stage) -> np.ndarray:
    """β of each row by turn: turn 1 β2 (stage I) or β1 (stage II), turn 2 β_H, turn 3 β_L."""
    beta_turn1 = stage.beta2 if stage.stage_id == 1 else stage.beta1
    betas = {1: beta_turn1, 2: stage.beta_h, 3: stage.beta_l}
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


def confidence_bonus(
    logp_with_feedback: np.ndarray, logp_without_feedback: np.ndarray, weight: float, clip: float
) -> np.ndarray:
    """λ·clip(mean-token log p(y*|x,z,g) − mean-token log p(y*|x,z)): feedback that makes the reference likelier."""
    return weight * np.clip(logp_with_feedback - logp_without_feedback, -clip, clip)


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


@core_algos.register_adv_est("reinforce")
def compute_reinforce_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE without a baseline: every response token's advantage is the row's return (γ = 1)."""
    returns = (token_level_rewards * response_mask).sum(dim=-1, keepdim=True) * response_mask
    return returns, returns


def compute_advantages(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, each (B, R), from verl's registered estimator ``estimator``.

    ``gae`` (PPO) and ``value_baseline`` need the critic's ``values`` (B, R); ``archer`` takes ``values`` as the
    advantages (the utterance critic's signal of each row on its tokens, ``utterance_critic.py``); the others are
    critic-free. ``config`` is verl's ``algorithm`` section (gamma, lam, norm_adv_by_std_in_grpo).
    """
    if estimator == "archer":  # the utterance critic's per-row signal, already on every response token
        if values is None:
            raise ValueError("adv_estimator=archer needs the utterance critic's values")
        signal = values * response_mask
        return signal, signal
    if estimator == "value_baseline":  # R − V(prompt) on every token (value_shaping.py)
        rewards = (token_level_rewards * response_mask).sum(-1).numpy()
        return vs.value_baseline_advantages(rewards, values, response_mask)
    fn = core_algos.get_adv_estimator_fn(estimator)
    if estimator == "gae":
        if values is None:
            raise ValueError("adv_estimator=gae needs the critic's values")
        return fn(
            token_level_rewards=token_level_rewards,
            values=values,
            response_mask=response_mask,
            gamma=config.gamma,
            lam=config.lam,
        )
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


def reference_scores(scores: dict[str, np.ndarray], problem, attempt, feedback) -> np.ndarray | None:
    """R_ref of each HL row: per feedback (lagged snapshot, (B, n, m)) or per attempt (no feedback, (B, n))."""
    if "r_ref" not in scores:
        return None
    r_ref = scores["r_ref"]
    return r_ref[problem, attempt, feedback] if r_ref.ndim == 3 else r_ref[problem, attempt]


def level_advantages(
    level: str,
    rows: dict[str, list],
    scores: dict[str, np.ndarray],
    kl: np.ndarray,
    stage: Stage,
    mlmt,
    algorithm,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    hl_extra: np.ndarray | None = None,
    feedback_values: np.ndarray | None = None,
) -> LevelAdvantages:
    """Task rewards → the level's estimator over its groups (→ minus β·KL with ``kl_in=advantage``): the advantages
    the level is updated with, and each row's β.

    Args:
        level: "ll" (turn-1 and turn-3 rows) or "hl" (turn-2 rows).
        rows: per-row ``problem``, ``attempt``, ``feedback`` and ``turn`` indices.
        scores: ``r1`` (B, n), ``r3`` (B, n, m) and, for the contrastive HL reward, ``r_ref``.
        kl: (N,) sequence KL of each row to the level's reference (zeros without a reference model).
        stage: the active stage's coefficients.
        mlmt: the ``mlmt`` config section (estimators, grouping, HL reward).
        algorithm: verl's ``algorithm`` section.
        response_mask: (N, R).
        values: (N, R) critic values for ``gae``; the utterance critic's signal for ``archer``.
        hl_extra: (N,) extra HL score (the confidence term), added to S2.
        feedback_values: (N,) V(x, z, g) of each feedback, for ``hl_reward=value_shaped`` (value_shaping.py).
    """
    problem, attempt = np.asarray(rows["problem"]), np.asarray(rows["attempt"])
    feedback, turn = np.asarray(rows["feedback"]), np.asarray(rows["turn"])
    r1 = scores["r1"][problem, attempt]
    # mlmt.feedback=none: no turn 3 (r3 is (B, n, 0)); every row is a turn-1 row
    r3 = scores["r3"][problem, attempt, feedback] if scores["r3"].shape[2] else np.zeros(len(problem))
    r3_advantages = None
    if level == "ll" and mlmt.ll.adv_estimator == "value_baseline":
        shaping = mlmt.value_shaping
        task = vs.solver_rewards(turn, r3, scores["r3"][problem, attempt], shaping.symmetric_reward)
    elif level == "ll":
        task = np.where(turn == 1, turn1_task_rewards(r1, stage), turn3_task_rewards(r1, r3, stage))
    elif mlmt.reward.hl_reward == "value_shaped":
        shaping = mlmt.value_shaping
        task = vs.shaped_hl_scores(r3, feedback_values, shaping.value_coef, shaping.symmetric_reward)
    else:
        reward, r_ref = mlmt.reward, reference_scores(scores, problem, attempt, feedback)
        task = hl_scores(r1, r3, reward.hl_reward, stage, reward.contrastive_lambda, r_ref)
        if hl_extra is not None:
            task = task + hl_extra
    index = group_keys(problem.tolist(), attempt.tolist(), turn.tolist(), mlmt.ll.turn3_group_by)
    estimator = mlmt[level].adv_estimator

    def estimate(rewards: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        token_rewards = place_on_last_token(rewards, response_mask)
        return per_turn_advantages(estimator, token_rewards, response_mask, index, algorithm, turn, values)

    advantages, returns = estimate(task)
    if level == "ll" and stage.stage_id == 1:  # stage I: turn 1 has no task reward, only its β2·KL term
        advantages = advantages * torch.as_tensor(turn != 1, dtype=advantages.dtype)[:, None]
    if level == "hl":
        r3_advantages = estimate(r3.astype(np.float64))[0]
    betas = kl_coefficients(turn, stage)
    if mlmt.stages.kl_in == "advantage":
        advantages, penalty = apply_kl_penalty(advantages, kl, betas, response_mask, turn)
    else:
        penalty = np.zeros(len(betas))
    return LevelAdvantages(advantages, returns, task, penalty, betas, r3_advantages)
