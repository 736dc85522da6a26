"""scripts/local_slurm.sh: each folder is its own cluster, and `stop` signals only its own daemons.

CI runs its two Slurm tests at once. With fixed ports the second cluster's daemons died at start (the port was
bound), its jobs ran on the first cluster, and its `stop` sent SIGTERM to the PID in the dead slurmctld's pid file:
by then, after the PIDs had wrapped, any process (another test's Ray node, a pytest worker). Here: two clusters at
once each run a two-node job on their own controller, one stopped leaves the other working, and a pid file naming
another process does not get that process killed. The second cluster's folder is deep, as a pytest folder can be:
slurmd's spool, where a job step's Unix socket is named, must stay short (it is not under the folder).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from slurm_jobs import ENDED, job_fields, submit

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/local_slurm.sh"


def _daemon_pids(folder: Path) -> dict[str, int]:
    return {f.stem: int(f.read_text()) for f in folder.glob("*.pid")}


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _run_job(env: dict, tmp_path: Path) -> dict:
    """A two-node job (`srun hostname` on both nodes) run to its end: its last fields."""
    job_id = submit(["sbatch", "--parsable", "-N2", f"--output={tmp_path}/%j.out", "--wrap", "srun hostname"], env)
    deadline = time.monotonic() + 60
    while (fields := job_fields(job_id, env)).get("JobState") not in ENDED:
        assert time.monotonic() < deadline, f"job {job_id} did not end within 60 s: {fields}"
        time.sleep(0.3)
    return {"id": job_id, **fields}


def test_two_clusters_at_once_each_run_their_jobs_and_stop_alone(slurm_cluster, tmp_path):
    first = Path(slurm_cluster["SLURM_CONF"]).parent
    second = tmp_path / ("deep" * 20) / "second"  # a job step's socket path under it would pass 108 bytes
    started = subprocess.run(["bash", str(SCRIPT), "start", str(second)], capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        env = {**slurm_cluster, "SLURM_CONF": str(second / "slurm.conf")}
        pids = _daemon_pids(second)
        assert set(pids) == {"slurmctld", "slurmd-n1", "slurmd-n2"}, pids
        assert all(_alive(pid) for pid in pids.values()), f"a daemon of the second cluster is not running: {pids}"
        ports = {
            folder: (folder / "slurm.conf").read_text().split("SlurmctldPort=")[1].split()[0]
            for folder in (first, second)
        }
        assert ports[first] != ports[second], ports

        job = _run_job(env, tmp_path)
        assert job["JobState"] == "COMPLETED", job
        assert f"JobId={job['id']}" in (second / "log/slurmctld.log").read_text()  # its own controller ran it
        assert f"JobId={job['id']}" not in (first / "log/slurmctld.log").read_text()

        stopped = subprocess.run(["bash", str(SCRIPT), "stop", str(first)], capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert _run_job(env, tmp_path)["JobState"] == "COMPLETED"  # the second cluster does not need the first
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(second)], timeout=60)
    assert not any(_alive(pid) for pid in pids.values())


def test_stop_leaves_a_process_whose_pid_is_in_a_stale_pid_file(tmp_path):
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "log").mkdir()
        for name in ("slurmctld", "slurmd-n1", "slurmd-n2"):  # a dead daemon's file, its PID since reused
            (tmp_path / f"{name}.pid").write_text(f"{stranger.pid}\n")
        stopped = subprocess.run(
            ["bash", str(SCRIPT), "stop", str(tmp_path)], capture_output=True, text=True, timeout=60
        )
        assert stopped.returncode == 0, stopped.stderr
        assert stranger.poll() is None, "stop killed a process that is not its daemon"
    finally:
        stranger.kill()
        stranger.wait()
