"""Per-turn scalar rewards (DESIGN.md §5), their GRPO group keys, and advantages from verl's estimator registry.

Pure functions over tensors and lists: unit-tested without Ray.

Rewards, placed on the last response token of each row (KL = Σ_t (log π − log π_ref) over the row's response):

    turn 1 (LL)   stage I: −β2·KL                 stage II: R1 − β1·KL
    turn 3 (LL)   stage I: R3 − β_L·KL            stage II: R3 + α(R3 − R1) − β_L·KL
    turn 2 (HL)   S2 − β_H·KL,  S2 = R3 | R3 + α(R3 − R1) | (1+λ)R3 − λ·R_ref   (+ optional confidence term)

Groups (nested, so GRPO is meaningful at both levels): turn-1 rows by problem; turn-3 rows by problem (or by
attempt); HL rows by the attempt they critique (the m feedbacks on one z).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo import core_algos


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
    """Index and coefficients of the stage active at 1-based training ``step``."""
    index = max(i for i, start in enumerate(stages_config.schedule) if start <= step - 1)
    return index, Stage(
        stage_id=int(stages_config.stage_ids[index]),
        beta1=float(stages_config.beta1[index]),
        beta2=float(stages_config.beta2[index]),
        beta_l=float(stages_config.beta_l[index]),
        beta_h=float(stages_config.beta_h[index]),
        alpha=float(stages_config.alpha[index]),
    )


def turn1_rewards(r1: np.ndarray, kl: np.ndarray, stage: Stage) -> np.ndarray:
    if stage.stage_id == 1:
        return -stage.beta2 * kl
    return r1 - stage.beta1 * kl


def turn3_rewards(r1_of_attempt: np.ndarray, r3: np.ndarray, kl: np.ndarray, stage: Stage) -> np.ndarray:
    reward = r3 - stage.beta_l * kl
    if stage.stage_id == 2:
        reward = reward + stage.alpha * (r3 - r1_of_attempt)
    return reward


def hl_scores(
    r1_of_attempt: np.ndarray,
    r3: np.ndarray,
    mode: str,
    alpha: float,
    contrastive_lambda: float,
    r_ref: np.ndarray | None,
) -> np.ndarray:
    """S2, the HL's task score for each feedback."""
    if mode == "r3":
        return r3.astype(np.float64)
    if mode == "progress":
        return r3 + alpha * (r3 - r1_of_attempt)
    if mode == "contrastive":
        if r_ref is None:
            raise ValueError("hl_reward=contrastive needs the no-feedback reference refinements' scores")
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

    ``gae`` (PPO) needs the critic's ``values`` (B, R); the others are critic-free. ``config`` is verl's
    ``algorithm`` section (gamma, lam, norm_adv_by_std_in_grpo).
    """
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
