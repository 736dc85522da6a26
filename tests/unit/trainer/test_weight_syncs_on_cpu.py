"""Weight syncs (actor -> rollout servers) happen only when the servers do not hold the actor's weights (issue 17,
item 8), and each step counts them (``perf/weight_syncs/<level>``).

The unit tier cannot start Ray, so each level here is a real :class:`PolicyGroup` whose ``CheckpointEngineManager``
is replaced by a recorder of the two calls the group makes (``update_weights``: a sync; ``sleep_replicas``: a sleep
that, in sleep mode, frees the weights). The same counts are checked on real workers and the ``hf`` server in sleep
mode by ``tests/e2e/test_weight_sync_run_on_cpu.py``.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agent_system.trainer.policy import PolicyGroup, SyncCounter, awake, stays_awake


class _Servers:
    """Records the checkpoint manager's calls and whether the servers hold weights (sleep mode frees them)."""

    def __init__(self, sleep_mode: bool) -> None:
        self.sleep_mode, self.calls, self.loaded = sleep_mode, [], False
        self.replicas = []  # the servers each wake-up checks are alive (none here: no Ray)

    def update_weights(self, global_steps):
        self.calls.append(("sync", global_steps))
        self.loaded = True

    def sleep_replicas(self):
        self.calls.append(("sleep", None))
        if self.sleep_mode:
            self.loaded = False


def _group(level="ll", sleep_mode=True, placement="colocated", freeze=False):
    view = OmegaConf.create(
        {
            "mlmt": {"placement": placement, "ll": {"freeze": freeze}, "hl": {"freeze": False}},
            "actor_rollout_ref": {"rollout": {"free_cache_engine": sleep_mode}},
        }
    )
    group = PolicyGroup(level, view, worker_group=None, use_ref=False)
    group.checkpoint_manager = _Servers(sleep_mode)
    return group


def _generate(group):
    assert group.checkpoint_manager.loaded, f"{group.level}: generating without weights"


def _validate(groups, batches, step):
    with awake(groups, step):  # MLMTTrainer.validate: one session around all batches
        for _ in range(batches):
            with awake(groups, step):  # MLMTTrainer.rollout: one per batch
                for group in groups:
                    _generate(group)


def _train_step(groups, step, updated):
    with awake(groups, step):
        for group in groups:
            _generate(group)
    for group in groups:
        if group.level in updated:
            group.sync_weights(step)


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_validation_wakes_once_for_all_its_batches(sleep_mode):
    ll = _group(sleep_mode=sleep_mode)
    counter = SyncCounter([ll])
    _validate([ll], batches=4, step=0)
    assert counter.take() == {"perf/weight_syncs/ll": 1.0}  # the first load (servers start from dummy weights)
    assert [c for c, _ in ll.checkpoint_manager.calls] == ["sync", "sleep"]
    _train_step([ll], step=1, updated={"ll"})
    _validate([ll], batches=4, step=1)
    # sleep mode: the training rollout reloads (its sleep freed them), the update's weights load at validation's
    # wake-up; without sleep mode: the update is pushed once, right after it
    assert counter.take() == {"perf/weight_syncs/ll": 2.0 if sleep_mode else 1.0}


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_frozen_level_under_split_placement_syncs_once_and_never_sleeps(sleep_mode):
    hl = _group("ll", sleep_mode=sleep_mode, placement="split", freeze=True)
    assert hl.keep_awake
    counter = SyncCounter([hl])
    for step in (1, 2, 3):
        _train_step([hl], step, updated=set())
        _validate([hl], batches=3, step=step)
    assert counter.take() == {"perf/weight_syncs/ll": 1.0}
    assert [c for c, _ in hl.checkpoint_manager.calls] == ["sync"]


def test_frozen_level_under_colocated_placement_sleeps_and_reloads_only_in_sleep_mode():
    """Colocated: the other level trains on the same devices, so the frozen level frees its memory."""
    assert not stays_awake(_group(placement="colocated", freeze=True).view, "ll")
    for sleep_mode, expected in ((True, 3.0), (False, 1.0)):
        frozen = _group(sleep_mode=sleep_mode, placement="colocated", freeze=True)
        counter = SyncCounter([frozen])
        for step in (1, 2, 3):
            _train_step([frozen], step, updated=set())
        assert counter.take() == {"perf/weight_syncs/ll": expected}


def test_an_update_inside_a_session_is_pushed_at_once():
    ll = _group(sleep_mode=True)
    with awake([ll], 0):
        ll.sync_weights(1)  # e.g. a checkpoint loaded while awake: the awake servers must not keep stale weights
        assert ll.checkpoint_manager.calls[-1] == ("sync", 1)
    assert ll.weight_syncs == 2


def test_unbalanced_session_close_is_an_error():
    with pytest.raises(RuntimeError, match="close_session"):
        _group().close_session()


def test_syncs_are_counted_per_level_and_reset_by_take():
    ll, hl = _group("ll"), _group("hl")
    counter = SyncCounter([ll, hl])
    _train_step([ll, hl], 1, updated={"ll"})
    assert counter.take() == {"perf/weight_syncs/ll": 1.0, "perf/weight_syncs/hl": 1.0}
    assert counter.take() == {"perf/weight_syncs/ll": 0.0, "perf/weight_syncs/hl": 0.0}
