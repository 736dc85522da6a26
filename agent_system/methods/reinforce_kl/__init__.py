"""REINFORCE with a refreshed reference KL (LLM_RL's "stable REINFORCE"; docs/METHOD.md, "Baselines";
recipes/reinforce_kl).

Selected by ``mlmt.ll.ref_refresh_freq > 0``: the LL's workers get the calls that copy the actor into the reference
(:class:`~agent_system.methods.reinforce_kl.ref_refresh.RefreshableActorWorker`), the reference is refreshed after
the LL update of every ``ref_refresh_freq``-th step, and saved with every checkpoint (``global_step_N/ll_reference``).
The estimator is the project's ``reinforce`` (``advantages.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_system.config import lora_rank, reference_in_actor, reference_needed
from agent_system.trainer.hooks import Extension


class ReferenceRefreshExtension(Extension):
    """The LL's reference ← actor every ``freq`` steps, and the reference's part of a checkpoint."""

    name = "ref_refresh"

    def __init__(self, freq: int) -> None:
        self.freq = freq
        self.refresh = None

    def actor_class(self, level: str, base: type) -> type:
        from agent_system.methods.reinforce_kl.ref_refresh import RefreshableActorWorker

        if level != "ll":
            return base
        if not issubclass(RefreshableActorWorker, base):
            raise TypeError(f"the reference refresh extends {RefreshableActorWorker.__base__.__name__}, not {base}")
        return RefreshableActorWorker

    def start(self, trainer: Any) -> None:
        from agent_system.methods.reinforce_kl.ref_refresh import ReferenceRefresh

        self.refresh = ReferenceRefresh(self.freq, trainer.tokenizers["ll"])

    def after_step(self, trainer: Any, step: int) -> dict[str, float]:
        return self.refresh.refresh(trainer.groups["ll"]) if self.refresh.due(step) else {}

    def save(self, trainer: Any, folder: Path) -> None:
        self.refresh.save(trainer.groups["ll"], folder)

    def restore(self, trainer: Any, folder: Path) -> dict[str, float]:
        return self.refresh.restore(trainer.groups["ll"], folder)


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """``mlmt.ll.ref_refresh_freq`` needs an LL reference model to refresh (a second copy: not LoRA's base) and an LL
    that trains."""
    freq = config.mlmt.ll.ref_refresh_freq
    if freq < 0:
        return [f"mlmt.ll.ref_refresh_freq={freq}: use 0 (never) or a period >= 1"]
    if freq == 0:
        return []
    if frozen["ll"]:
        return [f"mlmt.ll.ref_refresh_freq={freq} with {frozen['ll']}: the actor never changes"]
    if not reference_needed(config)["ll"]:
        return [
            f"mlmt.ll.ref_refresh_freq={freq} refreshes the LL's reference model, but there is none: set "
            "mlmt.stages.beta_turn1 / beta_turn3 > 0 or actor_rollout_ref.actor.use_kl_loss=true"
        ]
    if reference_in_actor(config)["ll"]:
        return [
            f"mlmt.ll.ref_refresh_freq={freq} with actor_rollout_ref.model.lora_rank="
            f"{lora_rank(config.actor_rollout_ref.model)}: with LoRA the LL's reference is its base model with the "
            "adapter switched off (no second copy), which a refresh cannot move; use full fine-tuning (lora_rank=0) "
            "or no refresh"
        ]
    return []


def extension(config) -> ReferenceRefreshExtension | None:
    freq = int(config.mlmt.ll.ref_refresh_freq)
    return ReferenceRefreshExtension(freq) if freq > 0 else None
