"""Fixtures of the e2e learning tests: the cue task's models and data (cue_task.py), built once per session."""

from __future__ import annotations

import pytest
from cue_task import train_cue_solver, write_dataset

from agent_system.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def cue_root(tmp_path_factory):
    return tmp_path_factory.mktemp("cue_task")


@pytest.fixture(scope="session")
def cue_data(cue_root):
    """(train parquet, validation parquet) of the cue task."""
    return write_dataset(cue_root)


@pytest.fixture(scope="session")
def cue_hl(cue_root):
    """An untrained tiny feedback writer (random weights)."""
    return build_tiny_model(cue_root / "hl", seed=1)


@pytest.fixture(scope="session")
def cue_ll_sure(cue_root):
    """A solver that answers right whenever the feedback carries the cue (and never otherwise)."""
    path = build_tiny_model(cue_root / "ll_sure", seed=0)
    loss = train_cue_solver(path, p_right_given_cue=1.0)
    assert loss < 0.05, loss
    return path


@pytest.fixture(scope="session")
def cue_ll_unsure(cue_root):
    """A solver that answers right about half the time when cued (and never otherwise): room for the LL to learn."""
    path = build_tiny_model(cue_root / "ll_unsure", seed=0)
    loss = train_cue_solver(path, p_right_given_cue=0.5)
    assert loss < 0.6, loss
    return path
