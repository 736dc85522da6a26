"""The lagged LL snapshot's config view, refresh folders and what a resume loads (the workers themselves run in
tests/e2e/test_method_knobs_on_cpu.py, which also resumes a run between a refresh and the next checkpoint)."""

import pytest
import torch
from omegaconf import OmegaConf

from agent_system.config import compose_config
from agent_system.levels.placement import assign_replica_ranks
from agent_system.levels.snapshot import (
    CHECKPOINT_FOLDER,
    REFRESH_FOLDER,
    SNAPSHOT,
    begin_refresh,
    commit_refresh,
    refresh_dir,
    restore_source,
    snapshot_view,
)
from agent_system.trainer import state as st


@pytest.mark.parametrize(("placement", "ll_gpus", "hl_gpus", "offset"), [("split", 1, 1, 2), ("split", 2, 3, 5)])
def test_snapshot_replicas_are_ranked_after_both_levels(placement, ll_gpus, hl_gpus, offset):
    # verl names servers and weight-transfer sockets by replica rank: the snapshot's must not collide with the levels'
    config = compose_config([f"mlmt.placement={placement}", f"mlmt.ll_gpus={ll_gpus}", f"mlmt.hl_gpus={hl_gpus}"])
    assign_replica_ranks(config)
    view = snapshot_view(config)
    assert view.actor_rollout_ref.rollout.custom.replica_rank_offset == offset
    assert view.actor_rollout_ref.rollout.custom.server_tag == SNAPSHOT
    assert view.actor_rollout_ref.model.path == config.actor_rollout_ref.model.path  # the LL's model
    assert config.actor_rollout_ref.rollout.custom.server_tag == "ll"  # the LL's own config is untouched


def test_snapshot_view_keeps_the_ll_sampling_settings():
    config = compose_config(["actor_rollout_ref.rollout.temperature=0.7"])
    assign_replica_ranks(config)
    view = snapshot_view(config)
    assert view.actor_rollout_ref.rollout.temperature == 0.7
    assert OmegaConf.select(view, "mlmt.reward.reg_gap") == config.mlmt.reward.reg_gap


def test_the_snapshot_saves_and_loads_its_weights_only():
    config = compose_config([])
    assign_replica_ranks(config)
    view = snapshot_view(config)
    assert list(view.actor_rollout_ref.actor.checkpoint.save_contents) == ["model"]
    assert list(view.actor_rollout_ref.actor.checkpoint.load_contents) == ["model"]
    assert "optimizer" in config.actor_rollout_ref.actor.checkpoint.save_contents  # the LL's own is untouched


def _write_weights(folder, step):
    (folder / "model_world_size_1_rank_0.pt").write_text(f"LL after step {step}")


def test_a_refresh_is_visible_only_once_complete_and_replaces_the_previous_one(tmp_path):
    _write_weights(begin_refresh(tmp_path, 20), 20)
    assert commit_refresh(tmp_path, 20) == refresh_dir(tmp_path, 20)
    # a crash while the LL writes the refresh of step 40: nothing named step_40 exists, step_20 is intact
    _write_weights(begin_refresh(tmp_path, 40), 40)
    assert not refresh_dir(tmp_path, 40).exists()
    assert (refresh_dir(tmp_path, 20) / "model_world_size_1_rank_0.pt").read_text() == "LL after step 20"
    # the next refresh removes the crash's leftover, and the older refresh once it is complete
    staging = begin_refresh(tmp_path, 60)
    assert sorted(p.name for p in (tmp_path / REFRESH_FOLDER).iterdir()) == [".tmp_step_60", "step_20"]
    _write_weights(staging, 60)
    commit_refresh(tmp_path, 60)
    assert sorted(p.name for p in (tmp_path / REFRESH_FOLDER).iterdir()) == ["step_60"]


def test_an_unwritten_refresh_is_not_committed(tmp_path):
    begin_refresh(tmp_path, 20)
    with pytest.raises(FileNotFoundError, match="tmp_step_20"):
        commit_refresh(tmp_path, 20)


def test_a_refresh_repeated_after_a_resume_replaces_the_crashed_runs_one(tmp_path):
    _write_weights(begin_refresh(tmp_path, 40), 40)
    commit_refresh(tmp_path, 40)
    staging = begin_refresh(tmp_path, 40)
    (staging / "model_world_size_1_rank_0.pt").write_text("resumed LL after step 40")
    commit_refresh(tmp_path, 40)
    assert (refresh_dir(tmp_path, 40) / "model_world_size_1_rank_0.pt").read_text() == "resumed LL after step 40"


def _checkpoint(root, step, refreshed_at):
    """A global_step_N folder as MLMTTrainer.save_checkpoint writes it (the snapshot's shards and trainer state)."""
    folder = st.step_dir(root / "checkpoints", step)
    (folder / CHECKPOINT_FOLDER).mkdir(parents=True)
    (folder / "ll").mkdir()
    _write_weights(folder / CHECKPOINT_FOLDER, refreshed_at)
    probe = torch.full((1, 8), -float(refreshed_at))
    state = {"global_step": step, "snapshot": {"refreshed_at": refreshed_at, "refresh_probe": probe}}
    st.write_trainer_state(root / "checkpoints", step, state)
    st.mark_latest(root / "checkpoints", step)
    return folder


def _resume(mode, run, source=None):
    root, step = st.resume_point(mode, run / "checkpoints", source)
    folder = st.step_dir(root, step)
    return restore_source(folder, step, st.read_trainer_state(root, step))


def test_a_crash_between_a_refresh_and_the_next_checkpoint_resumes_the_checkpoints_snapshot(tmp_path):
    # save_freq 50, reg_gap 20, a crash at step 70: refreshes at 20, 40, 60; the checkpoint of step 50 holds the
    # snapshot of the refresh at 40, and the newest refresh folder holds the LL of step 60
    for step in (20, 40):
        _write_weights(begin_refresh(tmp_path, step), step)
        commit_refresh(tmp_path, step)
    _checkpoint(tmp_path, 50, refreshed_at=40)
    _write_weights(begin_refresh(tmp_path, 60), 60)
    commit_refresh(tmp_path, 60)
    _write_weights(begin_refresh(tmp_path, 80), 80)  # (a second crash, mid-refresh, would leave this)
    folder, refreshed_at, probe = _resume("auto", tmp_path)
    assert folder == tmp_path / "checkpoints" / "global_step_50" / CHECKPOINT_FOLDER
    assert (folder / "model_world_size_1_rank_0.pt").read_text() == "LL after step 40"
    assert refreshed_at == 40 and torch.equal(probe, torch.full((1, 8), -40.0))


def test_resume_path_reads_the_source_runs_snapshot(tmp_path):
    source = tmp_path / "source"
    checkpoint = _checkpoint(source, 50, refreshed_at=40)
    run = tmp_path / "new_run"
    _write_weights(begin_refresh(run, 20), 20)  # this run's own (older) refresh must not be the one loaded
    commit_refresh(run, 20)
    folder, refreshed_at, _ = _resume("resume_path", run, str(checkpoint))
    assert folder == checkpoint / CHECKPOINT_FOLDER and refreshed_at == 40


def test_a_checkpoint_that_records_a_snapshot_it_does_not_hold_is_an_error(tmp_path):
    folder = _checkpoint(tmp_path, 50, refreshed_at=40)
    for child in (folder / CHECKPOINT_FOLDER).iterdir():
        child.unlink()
    (folder / CHECKPOINT_FOLDER).rmdir()
    with pytest.raises(FileNotFoundError, match="ll_snapshot"):
        _resume("auto", tmp_path)


def test_a_checkpoint_without_a_snapshot_gives_it_the_resumed_ll(tmp_path):
    # a checkpoint of a run without the contrastive reward (or of an older version)
    folder = st.step_dir(tmp_path / "checkpoints", 30)
    (folder / "ll").mkdir(parents=True)
    assert restore_source(folder, 30, {"global_step": 30}) == (folder / "ll", 30, None)
    (folder / "ll").rmdir()
    assert restore_source(folder, 30, {"global_step": 30}) == (None, 0, None)
