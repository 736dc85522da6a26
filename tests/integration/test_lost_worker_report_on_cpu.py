"""An xdist worker whose Ray GCS server went away dies without a Python traceback, and the CI guard's summary says
how (tests/_ci_guard.py, "Lost workers"; issue 43, item 8: a CI run's worker was lost in the two-policies vLLM test
and xdist said only "node down: Not properly terminated").

A real Ray driver in a pytest-xdist worker kills its own GCS server (SIGKILL, as an OOM killer or a stray signal
would). Ray's C++ core then ends the driver's process with exit status 1 once the GCS has been unreachable for
``RAY_gcs_rpc_server_reconnect_timeout_s`` (60 s by default; 5 s here), and its driver log only points at
``gcs_server.out``. The summary must hold the worker's exit status, that log line, and the last lines of the session's
GCS server and raylet logs. About 30 s.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
from guarded_pytest import run_guarded_pytest

pytestmark = pytest.mark.integration

_TEST_THAT_LOSES_ITS_GCS = """
import json, signal, time

import psutil, ray

def test_loses_its_gcs():
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    assert ray.get(ray.put(7)) == 7
    ray_processes = psutil.Process().children(recursive=True)
    with open("ray_processes.json", "w") as out:  # for the outer test to stop those that outlive this process
        json.dump([[p.pid, p.create_time()] for p in ray_processes], out)
    (gcs,) = [p for p in ray_processes if p.name() == "gcs_server"]
    gcs.send_signal(signal.SIGKILL)
    time.sleep(120)  # Ray ends this process long before
"""


def test_a_worker_that_lost_its_gcs_is_reported_with_its_exit_status_and_the_gcs_log(tmp_path):
    (tmp_path / "test_gcs_lost.py").write_text(_TEST_THAT_LOSES_ITS_GCS)
    ray_tmp = Path(tempfile.mkdtemp(prefix="mlmt-gcs-"))  # Ray's socket paths must stay under 108 bytes
    try:
        _lose_a_worker_and_read_the_summary(tmp_path, ray_tmp)
    finally:
        _kill_ray_processes_of(tmp_path)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _lose_a_worker_and_read_the_summary(tmp_path: Path, ray_tmp: Path) -> None:
    env = {
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_AUTH_MODE": "disabled",
        "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
        "RAY_ADDRESS": None,
    }
    result, summary = run_guarded_pytest(tmp_path, "test_gcs_lost.py", 1, env, "--max-worker-restart=0")
    assert result.returncode != 0 and summary, (result.stdout + result.stderr)[-4000:]
    assert re.search(r"LOST WORKER gw0 \(pid \d+\): Not properly terminated; exit status 1\b", summary), summary
    assert "Failed to connect to GCS within 5 seconds" in summary, summary  # the driver log's last line
    assert re.search(r"the last \d+ lines of \S+/logs/gcs_server\.out:", summary), summary
    assert re.search(r"the last \d+ lines of \S+/logs/raylet\.out:", summary), summary
    # then the guard ended what the dead worker left (before, its Ray processes outlived the whole pytest run)
    assert not _alive_of(tmp_path), summary
    assert re.search(r"\n  \d+ process\(es\) it left were killed: \d+ \S*(python|ray)", summary), summary


def _alive_of(folder: Path) -> list[psutil.Process]:
    """The dead driver's Ray processes, as it listed them, that are still alive."""
    listed = folder / "ray_processes.json"
    alive = []
    for pid, create_time in json.loads(listed.read_text()) if listed.exists() else []:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE:  # not a reused pid
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def _kill_ray_processes_of(folder: Path) -> None:
    """Kills the dead driver's Ray processes that are still alive (when the guard failed to)."""
    alive = _alive_of(folder)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)
