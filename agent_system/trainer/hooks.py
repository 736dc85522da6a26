"""The MLMT loop's extension points: what a method (a baseline, an extra reward term) may add to a step.

The loop (``mlmt_trainer.py``) names no method. A method lives in a package of ``agent_system/methods/`` and plugs in
through three registries and one hook class (docs/EXTENDING.md):

* an estimator: verl's ``register_adv_est`` (critic-free) or ``advantages.register_value_estimator`` (reads a value
  per response token);
* a level's task reward: ``advantages.register_task_reward``;
* per-step work: an :class:`Extension`, returned by the package's ``extension(config)`` when the config selects it.

:func:`agent_system.methods.load` imports every method package (each registers its estimators and rewards on import)
and returns the extensions the config selects; the trainer calls their hooks in that order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd
    from omegaconf import DictConfig
    from verl import DataProto

    from agent_system.levels.critic import CriticGroup
    from agent_system.levels.policy import PolicyGroup
    from agent_system.multi_turn_rollout.episode import EpisodeRunner
    from agent_system.trainer.advantages import LevelAdvantages
    from agent_system.trainer.rows import LevelInputs, LevelRows, StepData, StepScores


class Loop(Protocol):
    """What a hook may read of the trainer it is handed (``MLMTTrainer``); nothing else of it is extension API
    (``tests/unit/trainer/test_extension_points_on_cpu.py`` checks the methods read only these)."""

    config: DictConfig  # the whole run config
    mlmt: DictConfig  # config.mlmt
    global_step: int  # the step being run (or the last one, in save/restore)
    groups: dict[str, PolicyGroup]  # each level's policy workers and rollout servers
    critics: dict[str, CriticGroup]  # each level's verl critic, where it has one (advantages.critic_levels)
    tokenizers: dict[str, Any]  # each level's tokenizer
    runner: EpisodeRunner  # the episode runner (its prompts: runner.prompts)


class Extension:
    """Hooks a method adds to the loop; each does nothing unless overridden.

    Before the workers start, ``check_data`` reads the training rows. Order within a step: ``after_scores`` once
    the step is graded, then ``level_inputs`` and
    ``level_metrics`` while each level's batch is built (log-probs → the hook → advantages → metrics),
    ``before_updates`` once both batches exist, ``after_step`` after the updates. ``save`` /
    ``restore`` run with every checkpoint and on resume.
    """

    name = "extension"
    #: ``level_inputs`` reads another level's workers or pre-update state: every level's batch is built, one after the
    #: other, before any level updates
    builds_first = False

    def actor_class(self, level: str, base: type) -> type:
        """The Ray worker class of ``level``'s actor: ``base`` or a subclass of it adding registered calls."""
        return base

    def critic_loss(self, level: str) -> Callable | None:
        """The loss of ``level``'s verl critic, called as ``loss(config=..., model_output, data, dp_group)`` like verl's
        ``value_loss`` (which ``None`` keeps); it runs in the critic's worker processes."""
        return None

    def check_data(self, frame: pd.DataFrame, path: str) -> None:
        """Before any worker starts: refuse training rows the method cannot use (raise ValueError naming ``path``)."""

    def start(self, trainer: Loop) -> None:
        """Once, after the workers started and before the first step (start actors, load models)."""

    def after_scores(self, trainer: Loop, problems: list[dict], episodes: list, scores: StepScores) -> StepScores:
        """A training step's scores (graded, leaks checked) before its metrics and levels read them: return them
        with the method's own verdicts joined in (a new :class:`StepScores`). Not called while validating."""
        return scores

    def level_inputs(
        self, trainer: Loop, level: str, step: StepData, rows: LevelRows, batch: DataProto, inputs: LevelInputs
    ) -> dict[str, float]:
        """Fill ``inputs`` for ``level``'s rows (``values``, ``extra_reward``, ``features``); returns metrics."""
        return {}

    def level_metrics(self, level: str, inputs: LevelInputs, result: LevelAdvantages) -> dict[str, float]:
        """Metrics of ``level``'s advantages (what the method put into them)."""
        return {}

    def before_updates(self, trainer: Loop, batches: dict[str, DataProto]) -> None:
        """After every level's batch is built, before the first update (may add tensors to a batch)."""

    def after_step(self, trainer: Loop, step: int) -> dict[str, float]:
        """After the step's updates (their weights reach the rollout servers at the next wake-up); returns metrics."""
        return {}

    def save(self, trainer: Loop, folder: Path) -> None:
        """Write the method's state into the checkpoint folder ``global_step_N``."""

    def restore(self, trainer: Loop, folder: Path) -> dict[str, float]:
        """Restore the method's state from ``global_step_N`` on resume; returns metrics logged at the resumed step."""
        return {}
