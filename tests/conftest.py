"""Shared fixtures: tiny offline models (built once per session) and one Ray session for the integration tier."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray runs its workers at nice 15, below the driver. Two tests share the machine in CI (scripts/run_tests.sh): one
# test's processes outside Ray (a driver, the golds check's pool) would then starve the other test's Ray workers
# (measured: a two-level start-up stalled for minutes beside the golds check). Every test process at the same priority.
os.environ.setdefault("RAY_worker_niceness", "0")

# --- CI guard (tests/_ci_guard.py): the suite's peak memory in the terminal summary, and an autouse fixture that
# --- waits for (then kills) every process a test started before the next test begins. Keep this line here.
pytest_plugins = ["_ci_guard"]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow(seconds=N)`` first, the longest first, then the others in their collected order: a tier on
    several xdist workers (scripts/run_tests.sh) then ends with short tests on every worker, not one long test on one.

    Tests marked ``study`` (the multi-seed learning study) are left out unless ``-m`` names the mark
    (``MLMT_TEST_SET=study bash scripts/run_tests.sh``), so the per-commit run never starts them.
    """
    if "study" not in (config.option.markexpr or ""):
        study = [item for item in items if item.get_closest_marker("study")]
        if study:
            config.hook.pytest_deselected(items=study)
            items[:] = [item for item in items if not item.get_closest_marker("study")]

    def seconds(item) -> float:
        marker = item.get_closest_marker("slow")
        return marker.kwargs.get("seconds", 60) if marker else 0

    items.sort(key=seconds, reverse=True)  # a stable sort: equal keys keep their collected order


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build)``: ``build(folder)`` once per pytest run, shared by its xdist workers.

    The first worker to ask builds under a file lock and records what ``build`` returned (JSON: paths as strings);
    the others wait and read it. Without xdist it is a plain session-scoped build. For fixtures that take minutes of
    CPU (training the cue task's solvers), which each of the two CI workers would otherwise repeat.
    """
    import json

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder (pytest-N), above each worker's own (popen-gwK)

    def build_once(name: str, build):
        folder = root / f"built-{name}"
        with FileLock(f"{folder}.lock"):
            record = folder / ".built.json"
            if record.is_file():
                return json.loads(record.read_text())
            folder.mkdir(exist_ok=True)
            value = build(folder)
            record.write_text(json.dumps(value))
            return value

    return build_once


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

    from agent_system.launcher.main import start_local_ray

    start_local_ray(ray, num_cpus=16, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def ray_per_test():
    """A Ray session for one test (or parametrization): named worker and server actors never meet the next test's."""
    import ray

    from agent_system.launcher.main import start_local_ray

    start_local_ray(ray, num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
