"""`mlmt-configs/submit_mlmt.sbatch` on a real Slurm cluster of two virtual nodes on this machine.

The test starts slurmctld, munged and two slurmd (scripts/local_slurm.sh; Slurm is installed by .ci/run), submits
the batch script with `sbatch -N2 --wait` for a 1-step MLMT run on tiny models, and checks that the job COMPLETED,
that the trainer's driver saw a 2-node Ray cluster and trained a step, and that no Ray process outlived the job.
Without Slurm installed the test is skipped on a developer machine and fails in CI (CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def slurm_cluster(tmp_path):
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


def _ray_processes() -> set[int]:
    """Ray daemons of Slurm jobs: their session folder is the job's --temp-dir (ray-mlmt-<job id>), so a Ray that
    another program runs on the machine is not counted."""
    names = ("raylet", "gcs_server")
    return {
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if any(n in (p.info["name"] or "") for n in names) and "ray-mlmt-" in " ".join(p.info["cmdline"] or [])
    }


def test_sbatch_two_nodes_one_step(slurm_cluster, tiny_models, tmp_path):
    before = _ray_processes()
    out = tmp_path / "run"
    command = [
        "sbatch",
        "-N2",
        "--wait",
        f"--output={tmp_path / 'job.out'}",
        f"--chdir={REPO}",
        str(REPO / "mlmt-configs/submit_mlmt.sbatch"),
        f"actor_rollout_ref.model.path={tiny_models['ll']}",
        f"hl.model.path={tiny_models['hl']}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console]",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "hl.rollout.response_length=6",
        "mlmt.dataset.n_train=8",
        "mlmt.dataset.n_val=2",
        "mlmt.reward.num_workers=1",
    ]
    env = {**slurm_cluster, "MLMT_PYTHON": sys.executable, "MLMT_RAY_OBJECT_STORE_BYTES": "500000000"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log[-5000:]
    assert "Ray: 2 alive node(s)" in log, log[-5000:]
    assert "step:1 " in log and "ll/pg_loss" in log
    assert not (_ray_processes() - before), "Ray processes outlived the Slurm job"
