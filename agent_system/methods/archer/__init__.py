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

from agent_system.config import set_away_from_default
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


CHOICES = {"actor_signal": ("advantage", "q"), "v_target_action": ("policy", "buffer")}


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """Start-up checks of ``mlmt.archer`` (the utterance critic, ``critic.py``) and of where it may be selected."""
    mlmt, archer, errors = config.mlmt, config.mlmt.archer, []
    if mlmt.hl.adv_estimator == NAME:
        errors.append("mlmt.hl.adv_estimator=archer: the utterance critic scores the solver's turns; use it for the LL")
    errors += [
        f"mlmt.archer.{key}={archer[key]!r}: choose one of {allowed}"
        for key, allowed in CHOICES.items()
        if archer[key] not in allowed
    ]
    checks = {
        "gamma": 0 <= archer.gamma <= 1,
        "batch_size": archer.batch_size >= 1,
        "buffer_size": archer.buffer_size >= 1,
        "micro_batch_size": archer.micro_batch_size >= 1,
        "updates_per_step": archer.updates_per_step >= 1,
        "lr": archer.lr > 0,
        "max_grad_norm": archer.max_grad_norm > 0,
        "target_refresh_every": archer.target_refresh_every >= 1,
        "num_gpus": archer.num_gpus >= 0,
    }
    bad = [f"mlmt.archer.{key}={archer[key]!r}" for key, ok in checks.items() if not ok]
    if bad:
        errors.append(
            f"invalid {bad}: gamma in [0, 1]; batch_size, buffer_size, micro_batch_size, updates_per_step, "
            "target_refresh_every >= 1; lr, max_grad_norm > 0; num_gpus >= 0"
        )
    if mlmt.ll.adv_estimator != NAME:
        unread = set_away_from_default(config, ["mlmt.archer"])
        if unread:
            errors.append(
                f"{', '.join(unread)} with mlmt.ll.adv_estimator={mlmt.ll.adv_estimator}: mlmt.archer configures "
                "ArCHer's utterance critic, which only mlmt.ll.adv_estimator=archer starts, so they cannot act; unset "
                "them or select ArCHer"
            )
    if mlmt.ll.adv_estimator == NAME:
        if frozen["ll"]:
            errors.append(
                f"mlmt.ll.adv_estimator=archer with {frozen['ll']}: the utterance critic only gives the solver its "
                "advantages, and the solver is never updated, yet the critic would be started and trained; use "
                "another mlmt.ll.adv_estimator (e.g. grpo)"
            )
        if 1 in mlmt.stages.stage_ids or any(a > 0 for a in mlmt.stages.alpha):
            errors.append(
                "mlmt.ll.adv_estimator=archer rewards the critic with R1 (single turn) or R3 (end of the episode): "
                "mlmt.stages.stage_ids=1 and mlmt.stages.alpha > 0 would not reach it; use stage_ids [2] and alpha 0"
            )
    return errors


def model_path_keys(config) -> list[str]:
    """The utterance critic's model when the solver uses ArCHer."""
    return ["mlmt.archer.critic_model_path"] if config.mlmt.ll.adv_estimator == NAME else []


def resource_demands(config) -> list[tuple[str, dict[str, float]]]:
    """The utterance critic's actor: ``mlmt.archer.num_gpus`` devices (none on CPU: it then shares the driver's)."""
    gpus = config.mlmt.archer.num_gpus
    if config.mlmt.ll.adv_estimator != NAME or gpus <= 0:
        return []
    return [(f"ArCHer critic (mlmt.archer.num_gpus={gpus})", {"GPU": float(gpus)})]


def own_critics(config) -> dict[str, str]:
    """The solver's utterance critic, trained by the extension at a constant lr."""
    return {"ll": f"mlmt.{NAME} (utterance critic, constant lr)"} if config.mlmt.ll.adv_estimator == NAME else {}


def extension(config) -> ArcherExtension | None:
    return ArcherExtension() if config.mlmt.ll.adv_estimator == NAME else None
