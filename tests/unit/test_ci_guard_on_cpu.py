"""The CI guard (tests/_ci_guard.py) finds the processes a test left behind, orphans included, and only those."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil
import pytest
from _ci_guard import ProcessTracker, _terminate
from guarded_pytest import run_guarded_pytest

pytestmark = pytest.mark.external  # starts processes and a pytest run for the guard to find

# a driver that starts a child, waits for a line on stdin, starts two more children (one named after a Ray session
# of this driver, one after the pytest basetemp) and exits at once: all three become orphans
_DRIVER = """
import os, subprocess, sys
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
subprocess.Popen(sleeper + ["plain-child"])
print("ready", flush=True)
sys.stdin.readline()
subprocess.Popen(sleeper + [f"/tmp/ray/session_2026-01-01_00-00-00_123456_{os.getpid()}/logs"])
subprocess.Popen(sleeper + [sys.argv[1] + "/model"])
"""


def test_orphans_of_a_dead_driver_are_found_and_killed(tmp_path):
    tracker = ProcessTracker(os.getpid(), basetemp=str(tmp_path))
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "older"])  # e.g. a session fixture
    try:
        time.sleep(0.05)
        since = time.time()
        before = tracker.snapshot()
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert driver.stdout.readline().strip() == "ready"
        tracker.sample()  # the sampler sees the driver and its first child while the driver lives
        driver.stdin.write("go\n")
        driver.stdin.close()
        driver.wait(timeout=60)
        deadline = time.monotonic() + 30
        while len(left := tracker.started_since(before, since)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        names = sorted(" ".join(p.cmdline()) for p in left)
        assert len(left) == 3, names
        assert any("plain-child" in n for n in names) and any("/tmp/ray/session_" in n for n in names)
        assert any(str(tmp_path) in n for n in names)
        assert older.pid not in {p.pid for p in left}
        assert tracker.peak_bytes > 0 and older.pid in tracker.ours(tracker._table())
        assert _terminate(left) == []
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)
        assert tracker.started_since(before, since) == []
    finally:
        older.kill()
        older.wait()


_OLDER = """
import subprocess, sys, time
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("started", flush=True)
sys.stdin.readline()
child.kill()
"""


def test_an_older_process_and_its_new_children_are_left_alone():
    tracker = ProcessTracker(os.getpid())
    parent = subprocess.Popen(
        [sys.executable, "-c", _OLDER],  # e.g. the raylet of a session-scoped Ray cluster
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.05)
        since = time.time()
        before = tracker.snapshot()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "started"  # its new child: a worker of that cluster
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the test's own child
        try:
            left = tracker.started_since(before, since)
            assert [p.pid for p in left] == [worker.pid]
            assert len(psutil.Process(parent.pid).children()) == 1
        finally:
            worker.kill()
            worker.wait()
        assert tracker.started_since(before, since) == []
    finally:
        parent.stdin.close()  # the parent kills its child and exits
        parent.wait(timeout=30)


_LEAKY_TESTS = """
import subprocess, sys

def test_leaves_a_sleeper():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "leaked-by-a-test"])

def test_clean():
    pass
"""


def test_leftovers_of_xdist_workers_reach_the_summary(tmp_path):
    """Under ``-n 2`` (the unit tier in CI) a worker's leftover is killed and listed by the controller's summary."""
    (tmp_path / "test_leaky.py").write_text(_LEAKY_TESTS)
    result, summary = run_guarded_pytest(tmp_path, "test_leaky.py", 2, {"MLMT_TEST_CLEANUP_WAIT_S": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "test_leaky.py::test_leaves_a_sleeper: 1 process(es)" in summary and "leaked-by-a-test" in summary, summary
    assert "test_clean" not in summary[summary.index("tests that left processes behind") :]
    assert "no test left processes behind" not in summary
    assert re.search(r"peak memory: [0-9.]+ GB", summary)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "leaked-by-a-test" in " ".join(p.info["cmdline"] or [])]


_DYING_TEST = """
import os, pathlib, signal, time

def test_dies_like_a_driver_that_lost_its_raylet():
    pid = os.getpid()
    logs = pathlib.Path(os.environ["RAY_TMPDIR"], "ray", f"session_2026-01-01_00-00-00_123456_{pid}", "logs")
    logs.mkdir(parents=True)
    (logs / f"python-core-driver-01000000ffff_{pid}.log").write_text("started\\nThe raylet died, exiting now\\n")
    # the GCS server's last record, then one of its periodic stats dumps
    (logs / "gcs_server.out").write_text(
        "[2026-01-01 00:00:09,000 I 7 7] (gcs_server) gcs_server_main.cc:266: GCS server received SIGTERM\\n"
        "[2026-01-01 00:00:10,000 I 7 8] (gcs_server) gcs_server.cc:300: Event stats:\\n\\n\\n"
        + "\\tGcsStatsDump - 1 total (0 active)\\n" * 12
    )
    os.kill(pid, signal.SIGKILL)
"""


def test_a_lost_xdist_worker_is_reported_with_how_it_ended_and_its_ray_driver_log(tmp_path):
    """A worker that dies in a test: the summary names the signal and the last lines of its Ray driver log (before,
    xdist's "node down: Not properly terminated" was all a CI run said)."""
    (tmp_path / "test_dying.py").write_text(_DYING_TEST)
    result, summary = run_guarded_pytest(
        tmp_path, "test_dying.py", 1, {"RAY_TMPDIR": str(tmp_path)}, "--max-worker-restart=0"
    )
    assert result.returncode != 0
    lost = re.search(r"LOST WORKER gw0 \(pid (\d+)\): Not properly terminated; killed by SIGKILL", summary)
    assert lost, summary
    assert f"python-core-driver-01000000ffff_{lost.group(1)}.log" in summary, summary
    assert "    The raylet died, exiting now" in summary, summary
    # the session's GCS server log: its last records, not the stats dump that follows them; no raylet log was written
    gcs_tail = r"the last 2 lines of \S+/gcs_server\.out:\n.*received SIGTERM\n.*Event stats:\n"
    assert re.search(gcs_tail, summary), summary
    assert "GcsStatsDump" not in summary and "raylet.out" not in summary, summary
