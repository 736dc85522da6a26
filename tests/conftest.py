"""Shared fixtures: tiny offline models (built once per session) and one Ray session for the integration tier."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# --- CI guard (tests/_ci_guard.py): the suite's peak memory in the terminal summary, and an autouse fixture that
# --- waits for (then kills) every process a test started before the next test begins. Keep this line here.
pytest_plugins = ["_ci_guard"]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Two different tiny Qwen2 models with the same tokenizer: {"ll": path, "hl": path}."""
    from agent_system.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {"ll": build_tiny_model(root / "ll", seed=0), "hl": build_tiny_model(root / "hl", seed=1)}


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session for the whole pytest session, always shut down."""
    import ray

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def ray_per_test():
    """A Ray session for one test (or parametrization): named worker and server actors never meet the next test's."""
    import ray

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
