"""A pytest run, in a folder, of a test file under the CI guard (tests/_ci_guard.py) on pytest-xdist workers: for the
tests of what the guard's summary says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GUARD_HEADING = "memory and leftover processes"


def run_guarded_pytest(
    folder: Path, test_file: str, workers: int, env: dict[str, str | None], *pytest_args: str
) -> tuple[subprocess.CompletedProcess, str]:
    """``pytest -n WORKERS [PYTEST_ARGS] TEST_FILE`` in ``folder`` with the guard as a plugin, in this process's
    environment updated by ``env`` (a None value removes the variable). Returns the result and the guard's summary
    (its output from the guard's heading on; empty when there is none)."""
    run_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    for name, value in env.items():
        if value is None:
            run_env.pop(name, None)
        else:
            run_env[name] = value
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_ci_guard", "-n", str(workers)]
    result = subprocess.run(
        [*command, *pytest_args, test_file], cwd=folder, env=run_env, capture_output=True, text=True, timeout=300
    )
    start = result.stdout.find(GUARD_HEADING)
    return result, result.stdout[start:] if start >= 0 else ""
