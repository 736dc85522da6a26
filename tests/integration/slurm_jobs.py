"""Following a Slurm job of the real local cluster (the ``slurm_cluster`` fixture, tests/integration/conftest.py) in
the tests of the batch scripts: its fields, its log, its requeue delay shortened, the processes it left."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY")


def submit(command: list[str], env: dict) -> str:
    """``sbatch --parsable ...``: the job's id."""
    submitted = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def job_fields(job_id: str, env: dict) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def warn(job_id: str, env: dict, times: int = 1) -> None:
    """Slurm's time-limit warning, sent to the batch script as ``--signal=B:USR1`` sends it."""
    for _ in range(times):
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=env, timeout=30)


def follow(
    job_id: str,
    env: dict,
    log: Path,
    on_poll: Callable[[dict, str], None],
    timeout_s: float = 900,
    time_limit_min: int = 10,
) -> dict[str, str]:
    """Poll the job every 0.5 s until it ends, calling ``on_poll(its fields, its log's text)`` each time; returns its
    last fields (it is cancelled after ``timeout_s``, a hang guard).

    A requeued job waits for Slurm's requeue delay (~2 min, Reason=BeginTime): 15 s into that wait, once the previous
    start has been torn down (sooner, Slurm kills the start: "credential revoked"), it is made eligible and its time
    limit set to ``time_limit_min`` (`scontrol update jobid=N starttime=now timelimit=10`), so the next start runs to
    the end: Slurm's own warning comes --signal's seconds before that limit.
    """
    started, fields, hurried, waiting_since = time.monotonic(), {}, set(), {}
    while time.monotonic() - started < timeout_s:
        fields = job_fields(job_id, env)
        state, restarts = fields.get("JobState"), fields.get("Restarts", "0")
        on_poll(fields, log.read_text() if log.exists() else "")
        waiting = state == "PENDING" and fields.get("Reason") == "BeginTime"
        since = waiting_since.setdefault(restarts, time.monotonic()) if waiting else None
        if waiting and restarts not in hurried and time.monotonic() - since > 15:
            hurried.add(restarts)
            subprocess.run(
                ["scontrol", "update", f"jobid={job_id}", "starttime=now", f"timelimit={time_limit_min}"],
                env=env,
                timeout=30,
            )
        if state in ENDED:
            return fields
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env, timeout=30)
    return fields


def processes_with(variable: str, value: str, wait_s: float = 15) -> list[int]:
    """The processes whose environment holds ``variable=value`` (the test's mark, passed to the job by Slurm and
    inherited by everything the job starts), after up to ``wait_s`` for them to end."""

    def marked() -> list[int]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get(variable) == value:
                    found.append(process.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    deadline = time.monotonic() + wait_s
    while (left := marked()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left
