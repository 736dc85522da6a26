"""Resumable trainer state: the seeded problem sampler and the atomic ``latest`` checkpoint pointer."""

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from agent_system.levels import snapshot
from agent_system.trainer import state
from agent_system.trainer.state import ProblemSampler, latest_step, mark_latest, step_dir


def _frame(rows=12):
    return pd.DataFrame({"row": list(range(rows)), "question": [f"q{i}" for i in range(rows)]})


def _ids(batch):
    return [item["row"] for item in batch]


def _draw(sampler, batches):
    return [_ids(sampler.next_batch()) for _ in range(batches)]


def test_batches_are_dicts_of_rows():
    batch = ProblemSampler(_frame(), batch_size=3, seed=0).next_batch()
    assert len(batch) == 3
    assert all(item["question"] == f"q{item['row']}" for item in batch)


def test_same_seed_same_batches():
    assert _draw(ProblemSampler(_frame(), 3, seed=7), 10) == _draw(ProblemSampler(_frame(), 3, seed=7), 10)


def test_different_seed_different_order():
    assert _draw(ProblemSampler(_frame(), 3, seed=7), 4) != _draw(ProblemSampler(_frame(), 3, seed=8), 4)


def test_shuffled_and_each_row_once_per_epoch():
    sampler = ProblemSampler(_frame(12), batch_size=3, seed=0)
    epoch0 = sum(_draw(sampler, 4), [])
    epoch1 = sum(_draw(sampler, 4), [])
    assert sorted(epoch0) == list(range(12))
    assert sorted(epoch1) == list(range(12))
    assert epoch0 != list(range(12))  # shuffled
    assert epoch0 != epoch1  # a new permutation each epoch
    assert sampler.state_dict() == {"epoch": 1, "position": 12}


def test_incomplete_last_batch_is_dropped_without_repeats():
    sampler = ProblemSampler(_frame(10), batch_size=3, seed=1)
    epoch0 = sum(_draw(sampler, 3), [])
    assert len(set(epoch0)) == 9  # no row twice within an epoch
    next_batch = _ids(sampler.next_batch())
    assert sampler.state_dict() == {"epoch": 1, "position": 3}
    assert len(set(next_batch)) == 3


def test_no_shuffle_is_in_order():
    assert _draw(ProblemSampler(_frame(6), 2, seed=0, shuffle=False), 4) == [[0, 1], [2, 3], [4, 5], [0, 1]]


def test_resume_from_state_dict_continues_exactly():
    reference = ProblemSampler(_frame(), 3, seed=5)
    expected = _draw(reference, 11)
    interrupted = ProblemSampler(_frame(), 3, seed=5)
    first = _draw(interrupted, 6)  # ends mid-epoch 1
    saved = interrupted.state_dict()
    resumed = ProblemSampler(_frame(), 3, seed=5)
    resumed.load_state_dict(saved)
    assert first + _draw(resumed, 5) == expected


def test_dataset_smaller_than_batch_raises():
    with pytest.raises(ValueError, match="train_batch_size=5"):
        ProblemSampler(_frame(4), batch_size=5, seed=0)


# ---------------------------------------------------------------- checkpoint bookkeeping


def test_latest_step_without_pointer_is_none(tmp_path):
    assert latest_step(tmp_path) is None
    assert latest_step(tmp_path / "does-not-exist") is None


def test_latest_step_of_a_complete_checkpoint(tmp_path):
    step_dir(tmp_path, 6).mkdir()
    state.write_trainer_state(tmp_path, 6, {"step": 6, "sampler": {"epoch": 0, "position": 12}})
    mark_latest(tmp_path, 6)
    assert latest_step(tmp_path) == 6
    assert state.read_trainer_state(tmp_path, 6)["sampler"] == {"epoch": 0, "position": 12}


def test_latest_step_naming_an_incomplete_step_raises(tmp_path):
    step_dir(tmp_path, 9).mkdir()  # e.g. model saved but trainer_state.pt missing
    mark_latest(tmp_path, 9)
    with pytest.raises(FileNotFoundError, match="global_step_9"):
        latest_step(tmp_path)


def test_mark_latest_leaves_no_tmp_file(tmp_path):
    mark_latest(tmp_path, 3)
    mark_latest(tmp_path, 6)
    assert sorted(os.listdir(tmp_path)) == [state.LATEST]
    assert (tmp_path / state.LATEST).read_text().strip() == "6"


def test_mark_latest_crash_before_rename_keeps_the_previous_pointer(tmp_path, monkeypatch):
    mark_latest(tmp_path, 3)

    def crash(src, dst):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(state.os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        mark_latest(tmp_path, 6)
    assert (tmp_path / state.LATEST).read_text().strip() == "3"


def test_write_trainer_state_leaves_no_tmp_file(tmp_path):
    step_dir(tmp_path, 2).mkdir()
    state.write_trainer_state(tmp_path, 2, {"step": 2})
    assert os.listdir(step_dir(tmp_path, 2)) == ["trainer_state.pt"]


# ---------------------------------------------------------------- run length and resume point (issue 8, defect 5)


def test_total_training_steps_null_runs_total_epochs():
    # 10 rows, batch 3: 3 steps per epoch (the sampler starts a new epoch when a full batch no longer fits)
    assert state.total_training_steps(None, total_epochs=2, train_rows=10, batch_size=3) == 6
    assert state.total_training_steps(7, total_epochs=2, train_rows=10, batch_size=3) == 7
    sampler = ProblemSampler(_frame(10), batch_size=3, seed=0)
    draws = _draw(sampler, 3)
    assert sampler.epoch == 0 and len({row for batch in draws for row in batch}) == 9
    sampler.next_batch()
    assert sampler.epoch == 1  # the 4th batch is the next epoch's first


def _checkpoint(root, step):
    step_dir(root, step).mkdir(parents=True)
    state.write_trainer_state(root, step, {"global_step": step})
    mark_latest(root, step)


def test_resume_path_loads_the_given_folder_of_another_run(tmp_path):
    other, mine = tmp_path / "other" / "checkpoints", tmp_path / "mine" / "checkpoints"
    _checkpoint(other, 4)
    _checkpoint(mine, 4)  # this run's own folder has the same step: it must not be used
    root, step = state.resume_point("resume_path", mine, str(step_dir(other, 4)))
    assert (root, step) == (other.resolve(), 4)
    assert state.read_trainer_state(root, step) == {"global_step": 4}


def test_resume_path_to_an_incomplete_folder_raises(tmp_path):
    (tmp_path / "global_step_3").mkdir()
    with pytest.raises(FileNotFoundError, match="trainer_state.pt"):
        state.resume_point("resume_path", tmp_path / "mine", str(tmp_path / "global_step_3"))


def test_resume_auto_and_disable(tmp_path):
    assert state.resume_point("auto", tmp_path, None) is None
    _checkpoint(tmp_path, 2)
    assert state.resume_point("auto", tmp_path, None) == (tmp_path, 2)
    assert state.resume_point("disable", tmp_path, None) is None


# ---------------------------------------------------------------- checkpoint retention (issue 33, item 5)


def _save(root, step, keep):
    """What ``MLMTTrainer.save_checkpoint`` writes, in its order: both levels, critic, snapshot, state, pointer; then
    pruning."""
    folder = step_dir(root, step)
    for part in ("ll", "hl", "ll_critic", "ll_snapshot"):
        (folder / part).mkdir(parents=True)
        (folder / part / "model.pt").write_text(f"{part} at {step}")
    state.write_trainer_state(root, step, {"global_step": step, "snapshot": {"refreshed_at": step, "refresh_probe": 0}})
    mark_latest(root, step)
    return state.prune_checkpoints(root, keep)


def _folders(root):
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_pruning_keeps_the_newest_checkpoints_whole(tmp_path):
    deleted = [_save(tmp_path, step, keep=2) for step in (10, 20, 30, 40)]
    assert deleted == [[], [], [10], [20]]
    assert _folders(tmp_path) == ["global_step_30", "global_step_40"]
    for step in (30, 40):  # every part of a kept checkpoint stays: the resume reads each one
        assert sorted(os.listdir(step_dir(tmp_path, step))) == [
            "hl", "ll", "ll_critic", "ll_snapshot", "trainer_state.pt"
        ]  # fmt: skip
    assert state.resume_point("auto", tmp_path, None) == (tmp_path, 40)
    saved = state.read_trainer_state(tmp_path, 40)
    assert snapshot.restore_source(step_dir(tmp_path, 40), 40, saved)[0] == step_dir(tmp_path, 40) / "ll_snapshot"


def test_keep_one_deletes_the_previous_only_after_the_new_one_is_complete(tmp_path):
    _save(tmp_path, 5, keep=1)
    step_dir(tmp_path, 10).mkdir()  # a save of step 10 in progress (killed here): nothing is deleted
    (step_dir(tmp_path, 10) / "ll").mkdir()
    assert state.prune_checkpoints(tmp_path, 1) == []
    assert _folders(tmp_path) == ["global_step_10", "global_step_5"] and latest_step(tmp_path) == 5
    shutil.rmtree(step_dir(tmp_path, 10))
    assert _save(tmp_path, 10, keep=1) == [5]
    assert _folders(tmp_path) == ["global_step_10"]


def test_without_a_limit_every_checkpoint_stays(tmp_path):
    for step in (1, 2, 3):
        assert _save(tmp_path, step, keep=None) == []
    assert _folders(tmp_path) == ["global_step_1", "global_step_2", "global_step_3"]


def test_incomplete_folders_are_deleted_below_the_kept_ones_and_left_above_the_pointer(tmp_path):
    _save(tmp_path, 2, keep=2)
    step_dir(tmp_path, 3).mkdir()  # a save killed before its trainer state: incomplete, older than what is kept
    _save(tmp_path, 4, keep=2)
    _save(tmp_path, 6, keep=2)
    step_dir(tmp_path, 8).mkdir()  # above the pointer: a save in progress, or cut short and redone after the resume
    assert state.prune_checkpoints(tmp_path, 2) == []
    _save(tmp_path, 7, keep=2)  # e.g. a stop request's save between two save_freq steps
    assert _folders(tmp_path) == ["global_step_6", "global_step_7", "global_step_8"]


def test_a_kill_during_deletion_loses_nothing_and_leaves_no_resumable_remains(tmp_path, monkeypatch):
    for step in (10, 20):
        _save(tmp_path, step, keep=2)
    rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):  # the process dies half-way through deleting the oldest checkpoint
        (Path(path) / "ll" / "model.pt").unlink()
        raise KeyboardInterrupt("killed while deleting")

    monkeypatch.setattr(state.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 30, keep=2)
    monkeypatch.setattr(state.shutil, "rmtree", rmtree)
    # the half-deleted folder no longer has a global_step_N name: auto resumes from the new checkpoint, and it
    # cannot be given as trainer.resume_from_path
    assert _folders(tmp_path) == [".pruning_global_step_10", "global_step_20", "global_step_30"]
    assert state.resume_point("auto", tmp_path, None) == (tmp_path, 30)
    with pytest.raises(FileNotFoundError, match="not a complete global_step_N"):
        state.resume_point("resume_path", tmp_path, str(tmp_path / ".pruning_global_step_10"))
    assert len(os.listdir(step_dir(tmp_path, 20))) == 5  # the older kept checkpoint is whole
    _save(tmp_path, 40, keep=2)  # the next pruning removes the remains
    assert _folders(tmp_path) == ["global_step_30", "global_step_40"]


def test_a_kill_before_the_rename_deletes_nothing(tmp_path, monkeypatch):
    for step in (10, 20):
        _save(tmp_path, step, keep=None)

    def killed(src, dst):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(state.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        state.prune_checkpoints(tmp_path, 1)
    assert _folders(tmp_path) == ["global_step_10", "global_step_20"]
    assert len(os.listdir(step_dir(tmp_path, 10))) == 5 and latest_step(tmp_path) == 20


class _SavingGroup:
    """A level's (or critic's, or the snapshot's) worker group as ``save_checkpoint`` sees it: writes a shard."""

    def save_checkpoint(self, path, global_steps):
        Path(path).mkdir(parents=True)
        (Path(path) / "model.pt").write_text(str(global_steps))


class _Snapshot:
    def save(self, folder, step):
        _SavingGroup().save_checkpoint(folder / snapshot.CHECKPOINT_FOLDER, step)
        return {"refreshed_at": step, "refresh_probe": None}


def test_the_trainers_save_prunes_to_trainer_max_actor_ckpt_to_keep(tmp_path):
    from omegaconf import OmegaConf

    from agent_system.trainer.mlmt_trainer import MLMTTrainer

    trainer = object.__new__(MLMTTrainer)
    trainer.ckpt_dir, trainer.history, trainer.extensions = tmp_path, [], []
    mlmt = {"feedback": "model", "schedule": {"tH": 1, "tL": 1}, "ll": {"freeze": False}, "hl": {"freeze": False}}
    trainer.config = OmegaConf.create(
        {"trainer": {"max_actor_ckpt_to_keep": 2, "max_critic_ckpt_to_keep": None}, "mlmt": mlmt}
    )
    trainer.mlmt = trainer.config.mlmt
    trainer.groups = {"ll": _SavingGroup(), "hl": _SavingGroup()}
    trainer.critics, trainer.snapshot = {"hl": _SavingGroup()}, _Snapshot()
    trainer.sampler = ProblemSampler(_frame(), 3, seed=0)
    trainer._probe_log_probs = dict
    for step in (50, 100, 150):
        trainer.global_step = step
        trainer.save_checkpoint(stage_index=0)
    assert _folders(tmp_path) == ["global_step_100", "global_step_150"]
    assert sorted(os.listdir(step_dir(tmp_path, 100))) == ["hl", "hl_critic", "ll", "ll_snapshot", "trainer_state.pt"]
    assert latest_step(tmp_path) == 150


def test_keep_best_keeps_the_best_validation_step_besides_the_newest(tmp_path):
    """trainer.keep_best=val/final_acc with max_actor_ckpt_to_keep=2: the trainer's own choice of the best step
    (MLMTTrainer._best_checkpoint, on its history) survives pruning, and best_checkpoint.json names it; a better step
    later takes its place. Was: the best step was deleted two saves later like any other."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from agent_system.trainer.mlmt_trainer import MLMTTrainer

    accuracy = {10: 0.2, 20: 0.6, 30: 0.4, 40: 0.5, 50: 0.3, 60: 0.7}
    trainer = SimpleNamespace(
        config=OmegaConf.create({"trainer": {"keep_best": "val/final_acc"}}), history=[], ckpt_dir=tmp_path
    )
    kept = {}
    for step, value in accuracy.items():
        trainer.global_step = step
        trainer.history.append({"step": step, "val/final_acc": value, "train/acc@t1": 1.0})
        best = MLMTTrainer._best_checkpoint(trainer)
        _save_protecting(tmp_path, step, keep=2, protect=best)
        kept[step] = _folders(tmp_path)
    assert kept[50] == ["global_step_20", "global_step_40", "global_step_50"]  # 20 (0.6) outlived 30
    assert kept[60] == ["global_step_50", "global_step_60"]  # 60 is better: 20 goes at last
    assert json.loads((tmp_path / state.BEST).read_text()) == {"metric": "val/final_acc", "step": 60, "value": 0.7}
    assert state.resume_point("auto", tmp_path, None) == (tmp_path, 60)  # the resume takes the newest, not the best


def test_best_step_reads_only_checkpointed_steps_that_recorded_the_metric():
    history = [{"step": 1, "val/final_acc": 0.9}, {"step": 2}, {"step": 3, "val/final_acc": 0.5}]
    assert state.best_step(history, "val/final_acc", {2, 3}) == (3, 0.5)  # step 1 has no checkpoint
    assert state.best_step(history, "val/final_acc", {2}) is None
    assert state.best_step([*history, {"step": 4, "val/final_acc": 0.5}], "val/final_acc", {3, 4}) == (3, 0.5)


def _save_protecting(root, step: int, keep: int, protect: int | None) -> list[int]:
    folder = step_dir(root, step)
    (folder / "ll").mkdir(parents=True)
    state.write_trainer_state(root, step, {"global_step": step})
    mark_latest(root, step)
    return state.prune_checkpoints(root, keep, protect=protect)


def test_keep_best_is_refused_where_it_cannot_act():
    from agent_system.config import ConfigError, compose_config
    from agent_system.launcher.main import check_config

    check_config(compose_config(["trainer.keep_best=val/final_acc", "trainer.max_actor_ckpt_to_keep=2"]))
    with pytest.raises(ConfigError, match=r"trainer.keep_best=val/final_acc: the run never validates"):
        check_config(compose_config(["trainer.keep_best=val/final_acc", "trainer.test_freq=-1"]))
    with pytest.raises(ConfigError, match=r"trainer.keep_best='val/acc@t3': choose a validation metric"):
        check_config(compose_config(["trainer.keep_best=val/acc@t3", "mlmt.feedback=none"]))
    with pytest.raises(ConfigError, match=r"trainer.keep_best='val/acc_t3'"):
        check_config(compose_config(["trainer.keep_best=val/acc_t3"]))
