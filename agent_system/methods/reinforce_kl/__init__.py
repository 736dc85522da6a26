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


def extension(config) -> ReferenceRefreshExtension | None:
    freq = int(config.mlmt.ll.ref_refresh_freq)
    return ReferenceRefreshExtension(freq) if freq > 0 else None
