"""Fixtures of the integration tier shared by several test files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MLMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


@pytest.fixture(scope="module")
def math500_dir(tmp_path_factory):
    """$DATA_DIR with math500/test.parquet: the first 4 MATH-500 problems."""
    from agent_system.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("data")
    preprocess(
        "math500", str(root / "math500" / "test.parquet"), input_path=str(SHARED / "math500" / "test.jsonl"), limit=4
    )
    return root


@pytest.fixture
def slurm_cluster(tmp_path):
    """A real Slurm cluster of two virtual nodes on this machine (scripts/local_slurm.sh, its files under tmp_path),
    stopped after the test: the environment to run Slurm's commands in (SLURM_CONF set). Without Slurm installed the
    test is skipped on a developer machine and fails in CI (CI=true: .ci/run installs it)."""
    if not (shutil.which("sbatch") and shutil.which("slurmctld") and shutil.which("munged")):
        if os.environ.get("CI"):
            pytest.fail("Slurm is not installed: .ci/run installs it with `bash scripts/local_slurm.sh install`")
        pytest.skip("Slurm is not installed (bash scripts/local_slurm.sh install)")
    folder = tmp_path / "slurm"
    start = subprocess.run(
        ["bash", str(REPO / "scripts/local_slurm.sh"), "start", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    finally:
        subprocess.run(["bash", str(REPO / "scripts/local_slurm.sh"), "stop", str(folder)], timeout=60)
