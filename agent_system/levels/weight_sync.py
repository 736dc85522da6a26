"""One weight push per weight change: when the rollout servers sleep and receive their actor's weights.

A group's servers (the LL's, the HL's, the lagged snapshot's) hold their actor's current weights until the actor
changes (an update, a checkpoint load, the snapshot's refresh: :meth:`PolicyGroup.weights_changed`) or a sleep frees
them: in sleep mode (``rollout.free_cache_engine``) verl sleeps vLLM at level 2, which discards the weights, and its
only way back is a push (the hf server on CPU does the same). Hence three rules (docs/ARCHITECTURE.md, "Weight
syncs", tabulates the pushes per step):

* **Push only where needed.** :meth:`RolloutWeights.wake` runs before each training rollout and each validation, and
  pushes only into the servers that do not hold their actor's weights; under ``placement=split`` the groups push side
  by side. Each push is counted and timed (``perf/weight_syncs/<level>``, ``timing_s/sync_<level>``), outside the
  step's ``timing_s/generate``.
* **Sleep only for training.** After the training rollout, a group's servers sleep only when the step's training
  needs their devices (:func:`sleeps_for_training`); nothing sleeps after a validation (the next use of the devices
  is the next rollout).
* **An idle level keeps its weights asleep.** A level the step does not update sleeps at vLLM level 1
  (``verl_compat.sleep_replicas``: the weights wait in host memory) and wakes without a push; only an updated
  level's sleep discards its weights, which its next push replaces anyway. So a sleep never costs a push, under
  ``colocated`` as under ``split``.

:func:`pushes_per_step` states the pushes these rules make per step without any worker: what the GPU check
(``scripts/gpu_check.py``) expects, and what docs/ARCHITECTURE.md's table lists.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: pushes_per_step imports without Ray or torch (scripts/gpu_check.py)
    from agent_system.levels.policy import PolicyGroup

TRAINED_LEVELS = ("ll", "hl")  # the lagged snapshot only generates: its devices hold nothing that trains


def sleeps_for_training(level: str, active: list[str], placement: str, reads_other_levels: bool) -> bool:
    """Whether ``level``'s rollout servers sleep after this step's rollout: the step's training uses their devices.

    Args:
        level: ``"ll"``, ``"hl"`` or the lagged snapshot's name (devices of its own, never trained: never sleeps).
        active: the levels updated at this step (:func:`agent_system.trainer.schedule.levels_to_update`).
        placement: ``mlmt.placement``: ``colocated`` levels share their devices, ``split`` ones do not.
        reads_other_levels: an extension builds a level's batch with another level's workers
            (``Extension.builds_first``, e.g. the confidence term scores the HL's rows with the LL).
    """
    if level not in TRAINED_LEVELS:
        return False
    if placement == "split" and not reads_other_levels:
        return level in active
    return bool(active)


def keeps_weights_asleep(level: str, active: list[str]) -> bool:
    """Whether ``level``'s servers, when they sleep for this step's training, keep their weights (vLLM level 1): the
    step does not update ``level`` (``active``: the levels it updates), so the weights they hold stay current."""
    return level not in active


def pushes_per_step(
    steps: list[int], update_steps: dict[str, list[int]], validation_steps: list[int]
) -> dict[int, dict[str, int]]:
    """Pushes per step and level (``perf/weight_syncs/<level>``) of one process that runs ``steps`` in order.

    The rules of :class:`RolloutWeights` in ``MLMTTrainer.fit``'s order: a new process's servers hold no weights
    (vLLM's dummy ones; a resumed process too); each step wakes the servers for its rollout, sleeps those whose
    devices its training needs, updates its levels (a new weight version each), then wakes them again for a
    validation where one is due. Each wake-up pushes into the servers that do not hold their actor's current
    version. A sleep costs no push, whatever the placement and sleep mode: an idle level's sleep keeps its weights
    (:func:`keeps_weights_asleep`), and an updated level's weights are replaced by the push of its update anyway.
    Step 0 is the validation before training.

    Args:
        steps: the steps the process runs, in order (a resumed process starts after its checkpoint).
        update_steps: level → the steps that update it (the run plan's ``levels.<level>.update_steps``).
        validation_steps: the steps followed by a validation (the run plan's ``validation_steps``).

    Returns:
        ``{step: {level: pushes}}``.
    """
    version = dict.fromkeys(update_steps, 0)
    held: dict[str, int | None] = dict.fromkeys(update_steps, None)

    def wake(counts: dict[str, int]) -> None:
        for level in update_steps:
            if held[level] != version[level]:
                held[level], counts[level] = version[level], counts[level] + 1

    pushes = {}
    for step in steps:
        counts = dict.fromkeys(update_steps, 0)
        if step > 0:
            wake(counts)  # the training rollout
            for level in update_steps:
                if step in update_steps[level]:
                    version[level] += 1
        if step in validation_steps:
            wake(counts)
        pushes[step] = counts
    return pushes


class RolloutWeights:
    """Wakes (pushing where needed) and puts to sleep the rollout servers of every group; reports the pushes.

    ``groups``: level name → :class:`PolicyGroup`, the lagged snapshot's included."""

    def __init__(self, groups: dict[str, PolicyGroup], placement: str, reads_other_levels: bool) -> None:
        self.groups = dict(groups)
        self.placement, self.reads_other_levels = placement, reads_other_levels
        self.seen = {level: (group.weight_syncs, group.sync_seconds) for level, group in self.groups.items()}

    def wake(self, global_steps: int) -> None:
        """Every group's servers awake with their actor's weights: a push into each that does not hold them.

        Under ``placement=split`` the groups' pushes run side by side (separate worker processes); colocated levels
        share processes, whose calls must not be submitted from two threads, so they push one after the other."""
        groups = list(self.groups.values())
        if self.placement == "split" and sum(not group.rollout_current for group in groups) > 1:
            with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="mlmt_sync") as pool:
                list(pool.map(lambda group: group.wake_up(global_steps), groups))
            return
        for group in groups:
            group.wake_up(global_steps)

    def sleep_for_training(self, active: list[str]) -> None:
        """After the training rollout: sleep the servers whose devices the step's training uses, those of a level the
        step does not update keeping their weights."""
        for level, group in self.groups.items():
            if sleeps_for_training(level, active, self.placement, self.reads_other_levels):
                group.sleep(keep_weights=keeps_weights_asleep(level, active))

    def take(self) -> dict[str, float]:
        """Pushes since the last call, per group: ``perf/weight_syncs/<level>`` and ``timing_s/sync_<level>``."""
        metrics = {}
        for level, group in self.groups.items():
            syncs, seconds = self.seen[level]
            metrics[f"perf/weight_syncs/{level}"] = float(group.weight_syncs - syncs)
            metrics[f"timing_s/sync_{level}"] = group.sync_seconds - seconds
            self.seen[level] = (group.weight_syncs, group.sync_seconds)
        return metrics
