"""Bi-level value shaping (hrl-reasoning's MLMT-RL; docs/METHOD.md, "Baselines"; recipes/value_shaping).

Selected by ``mlmt.ll.adv_estimator=value_baseline`` (the solver's R − V(prompt), estimator ``value_baseline`` with
the LL's verl critic) and/or ``mlmt.reward.hl_reward=value_shaped`` (the HL's R3 + c·V(x, z, g), a registered task
reward). The functions: :mod:`agent_system.methods.value_shaping.shaping`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch

from agent_system.methods.value_shaping import shaping
from agent_system.trainer.advantages import register_task_reward, register_value_estimator
from agent_system.trainer.hooks import Extension

BASELINE, SHAPED = "value_baseline", "value_shaped"
FEEDBACK_VALUES = "feedback_values"  # LevelInputs.features: V(x, z, g) of each HL row


@register_value_estimator(BASELINE, critic=True)
def value_baseline_advantages(token_level_rewards, values, response_mask, config) -> tuple[torch.Tensor, torch.Tensor]:
    """R − V(prompt) on every token of a row; returns R (the critic's target)."""
    rewards = (token_level_rewards * response_mask).sum(-1).numpy()
    return shaping.value_baseline_advantages(rewards, values, response_mask)


@register_task_reward(BASELINE, selects=lambda level, mlmt: level == "ll" and mlmt.ll.adv_estimator == BASELINE)
def solver_rewards(rows, scores, stage, mlmt, inputs) -> np.ndarray:
    """R of each solver row: its refinement's R3 (turn 3), the mean R3 of its attempt's refinements (turn 1)."""
    r3_of_row = scores.r3[rows.problem, rows.attempt, rows.feedback]
    symmetric = mlmt.value_shaping.symmetric_reward
    return shaping.solver_rewards(rows.turn, r3_of_row, scores.r3[rows.problem, rows.attempt], symmetric)


@register_task_reward(
    SHAPED, selects=lambda level, mlmt: level == "hl" and mlmt.reward.hl_reward == SHAPED, hl_reward=True
)
def shaped_hl_rewards(rows, scores, stage, mlmt, inputs) -> np.ndarray:
    """S2 = R3 + c·V(x, z, g) of each feedback, V from ``inputs.features["feedback_values"]``."""
    r3 = scores.r3[rows.problem, rows.attempt, rows.feedback]
    settings = mlmt.value_shaping
    return shaping.shaped_hl_scores(
        r3, inputs.features.get(FEEDBACK_VALUES), settings.value_coef, settings.symmetric_reward
    )


class ValueShaping(Extension):
    """The HL's feedback values from the LL's critic, the full-grad weights of the critic's loss, and the metrics."""

    name = "value_shaping"

    def __init__(self, baseline: bool, shaped: bool, settings) -> None:
        self.baseline, self.shaped, self.full_grad = baseline, shaped, settings.value_grad == "full"
        self.value_coef, self.value_grad = settings.value_coef, settings.value_grad
        # the HL's reward reads the LL's critic before the LL's update (and, full-grad, the LL's critic loss reads
        # the HL's pre-update log-probs)
        self.builds_first = shaped

    def level_inputs(self, trainer, level, step, rows, batch, inputs) -> dict[str, float]:
        if level == "hl" and self.shaped:
            inputs.features[FEEDBACK_VALUES] = feedback_values(trainer, rows.select(2), step.episodes)
        return {}

    def level_metrics(self, level, inputs, result) -> dict[str, float]:
        if (level == "ll" and self.baseline) or (level == "hl" and self.shaped):
            features = inputs.features.get(FEEDBACK_VALUES)
            return shaping.level_metrics(level, inputs.values, result.returns, features, inputs.response_mask)
        return {}

    def critic_loss(self, level: str):
        """The LL critic's loss with the shaping term (``shaping.critic_loss``) when the HL's reward reads V."""
        if level == "ll" and self.shaped:
            return partial(shaping.critic_loss, value_coef=self.value_coef, value_grad=self.value_grad)
        return None

    def before_updates(self, trainer, batches) -> None:
        if self.full_grad and {"ll", "hl"} <= batches.keys():
            batches["ll"].batch[shaping.HL_LOG_PROB_WEIGHT] = shaping.critic_weights(batches["ll"], batches["hl"])


def feedback_values(trainer: Any, hl_rows, episodes: list) -> np.ndarray:
    """V(x, z, g) of each HL row: the solver critic's value of the turn-3 prompt the feedback leads to (position 0
    of the turn-3 row); the LL's turn-3 rows are in the HL rows' order (one per feedback)."""
    from agent_system.trainer.packing import build_rows, padding_id
    from agent_system.trainer.rows import LevelRows

    turn3 = LevelRows.of("ll", episodes).select(3)
    if any(
        not np.array_equal(getattr(turn3.keys, k), getattr(hl_rows.keys, k)) for k in ("problem", "attempt", "feedback")
    ):
        raise ValueError("the solver's turn-3 rows are not in the order of the feedback rows")
    batch = build_rows(turn3.prompts, turn3.responses, padding_id(trainer.tokenizers["ll"]))
    return trainer.critics["ll"].compute_values(batch)[:, 0].numpy()


def extension(config) -> ValueShaping | None:
    mlmt = config.mlmt
    baseline, shaped = mlmt.ll.adv_estimator == BASELINE, mlmt.reward.get("hl_reward") == SHAPED
    if not (baseline or shaped):
        return None
    return ValueShaping(baseline, shaped, mlmt.value_shaping)


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """Contradictory or inert value-shaping settings (``shaping.config_errors``)."""
    return shaping.config_errors(config, frozen)
