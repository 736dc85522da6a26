"""Fixtures of the e2e learning tests: the cue task's and the relay task's models and data (cue_task.py,
agent_system/demos/relay.py), built once per pytest run (shared by its xdist workers: ``built_once`` in
tests/conftest.py)."""

from __future__ import annotations

import pytest
from cue_task import train_cue_solver, write_dataset

from agent_system.demos.relay import build_task
from agent_system.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def cue_data(built_once):
    """(train parquet, validation parquet) of the cue task."""
    return tuple(built_once("cue_data", lambda folder: [str(path) for path in write_dataset(folder)]))


@pytest.fixture(scope="session")
def cue_hl(built_once):
    """An untrained tiny feedback writer (random weights)."""
    return built_once("cue_hl", lambda folder: str(build_tiny_model(folder / "model", seed=1)))


def _cue_solver(folder, p_right_given_cue: float, max_loss: float) -> str:
    path = str(build_tiny_model(folder / "model", seed=0))
    loss = train_cue_solver(path, p_right_given_cue=p_right_given_cue)
    assert loss < max_loss, loss
    return path


@pytest.fixture(scope="session")
def cue_ll_sure(built_once):
    """A solver that answers right whenever the feedback carries the cue (and never otherwise)."""
    return built_once("cue_ll_sure", lambda folder: _cue_solver(folder, 1.0, max_loss=0.05))


@pytest.fixture(scope="session")
def cue_ll_unsure(built_once):
    """A solver that answers right about half the time when cued (and never otherwise): room for the LL to learn."""
    return built_once("cue_ll_unsure", lambda folder: _cue_solver(folder, 0.5, max_loss=0.6))


@pytest.fixture(scope="session")
def relay_models(built_once):
    """``relay_models(seed)``: the relay task of ``seed`` (``agent_system.demos.relay.build_task``): {"ll", "hl",
    "train", "val"} paths; the golds and both warm-ups drawn with the seed. Each warm-up is checked by what it was
    trained to do (its response probabilities on prompts it was not trained on: the solver copies the feedback's
    number with probability 0.45-0.75, the writer states the gold 0.2-0.4, either answers another code at most 0.05,
    or the build raises), not by its last batch's loss: a solver warm-up that ended under the loss bound once copied
    the feedback's digit a quarter of the time where 0.6 was asked."""
    return lambda seed: built_once(f"relay_{seed}", lambda folder: build_task(folder, seed))
