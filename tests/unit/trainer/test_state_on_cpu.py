"""Resumable trainer state: the seeded problem sampler and the atomic ``latest`` checkpoint pointer."""

import os

import pandas as pd
import pytest

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
