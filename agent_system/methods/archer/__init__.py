"""ArCHer (Zhou et al., 2024): an utterance-level critic whose Q − V (or Q) of each solver turn is the actor's
advantage on every token of that turn (docs/METHOD.md, "Baselines"; recipes/archer).

Selected by ``mlmt.ll.adv_estimator=archer``. Registers the estimator ``archer`` (the per-token values are the
advantages) and, through :class:`ArcherExtension`, trains the critic on every solver batch before scoring its rows
and saves it to ``global_step_N/archer_critic/``. The critic itself: :mod:`agent_system.methods.archer.critic`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agent_system.trainer.advantages import register_value_estimator
from agent_system.trainer.hooks import Extension

NAME = "archer"
FOLDER = "archer_critic"  # in global_step_N/


@register_value_estimator(NAME, critic=False)
def archer_advantages(token_level_rewards, values, response_mask, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The utterance critic's per-row signal, already on every response token, as advantages and returns."""
    signal = values * response_mask
    return signal, signal


class ArcherExtension(Extension):
    """Starts the utterance critic, trains it on each step's transitions and gives the solver's rows its values."""

    name = NAME

    def __init__(self) -> None:
        self.critic = None

    def start(self, trainer: Any) -> None:
        from agent_system.methods.archer.critic import ArcherCritic

        self.critic = ArcherCritic(trainer.config)
        self.critic.init()

    def level_inputs(self, trainer, level, step, rows, batch, inputs) -> dict[str, float]:
        if level != "ll":
            return {}
        inputs.values, metrics = self.critic.advantage_values(step.episodes, step.scores, rows, inputs.response_mask)
        return metrics

    def save(self, trainer: Any, folder: Path) -> None:
        self.critic.save_checkpoint(str(folder / FOLDER), trainer.global_step)

    def restore(self, trainer: Any, folder: Path) -> dict[str, float]:
        if (folder / FOLDER).is_dir():
            self.critic.load_checkpoint(str(folder / FOLDER))
        return {}


def extension(config) -> ArcherExtension | None:
    return ArcherExtension() if config.mlmt.ll.adv_estimator == NAME else None
