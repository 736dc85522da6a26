"""mlmt-configs/submit_eval.sbatch and recipes/submit_compare.sbatch (with scripts/lib/slurm_requeue.sh, the stop and
requeue part they share with submit_mlmt.sbatch): what each passes to its program, and when it requeues the job.

The batch scripts run through bash with stand-ins for `scontrol` and the Python (each logs its argv; the Python runs
until signalled, or exits with the status it is given), and Slurm's variables of a job. The warning is SIGUSR1 to the
batch script, as `--signal=B:USR1@S` sends it. The real Slurm runs are
tests/integration/test_slurm_eval_and_compare_on_cpu.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.external  # runs the batch scripts with stand-in processes

REPO = Path(__file__).resolve().parents[2]
EVAL = REPO / "mlmt-configs" / "math" / "submit_eval.sbatch"  # the link beside eval_math500.sh
COMPARE = REPO / "recipes" / "submit_compare.sbatch"

# The program: logs its argv, then exits with $EXIT at once, or (EXIT=wait) runs until a signal: with TRAP=75 it
# handles SIGUSR1 and exits 75 (as the trainer and compare do), else SIGUSR1's default action ends it.
STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$(basename "$0")" = python ] || exit 0
if [ "$EXIT" != wait ]; then exit "$EXIT"; fi
[ -z "$TRAP" ] || trap 'echo USR1 >> "$CALLS"; exit "$TRAP"' USR1
touch "$CALLS.running"
for _ in $(seq 300); do sleep 0.1; done
exit 9
"""


def _run(tmp_path: Path, script: Path, args: list[str], warn: bool, **env_extra: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "python"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "MLMT_PYTHON": str(bin_dir / "python"),
        "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_JOB_ID": "1234",
        "EXIT": "wait" if warn else "0",
        "TRAP": "",
        **env_extra,
    }
    process = subprocess.Popen(["bash", str(script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    if warn:
        deadline = time.monotonic() + 30
        while not Path(f"{calls}.running").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGUSR1)  # Slurm's warning to the batch script
        time.sleep(0.2)
        process.send_signal(signal.SIGUSR1)  # a repeated one changes nothing
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout, stderr, calls.read_text().splitlines()


def test_eval_warned_mid_run_ends_the_evaluator_and_requeues(tmp_path):
    code, stdout, stderr, calls = _run(tmp_path, EVAL, ["some/ll", "some/hl", "--out", "eval/x"], warn=True)
    assert code == 0, stderr
    assert calls[0].startswith("python -m agent_system.eval.math500 --ll some/ll --hl some/hl --data ")
    assert calls[0].endswith(" --out eval/x") and calls[1:] == ["scontrol requeue 1234"]
    assert stdout.splitlines() == [
        "MLMT eval job 1234: start 1 on " + os.uname().nodename.split(".")[0],
        "MLMT eval job 1234: the stop request ended the evaluation, which keeps the problems it finished (exit 138); "
        "requeue",
    ]


@pytest.mark.parametrize("status", ["0", "2"])
def test_eval_that_ends_on_its_own_is_not_requeued(status, tmp_path):
    code, _, stderr, calls = _run(tmp_path, EVAL, ["some/ll", "--out", "eval/x"], warn=False, EXIT=status)
    assert code == int(status), stderr
    assert [call.split()[0] for call in calls] == ["python"]  # no scontrol requeue


def test_compare_warned_mid_run_stops_with_75_and_requeues(tmp_path):
    code, stdout, stderr, calls = _run(tmp_path, COMPARE, ["--out", "cmp", "--steps", "2"], warn=True, TRAP="75")
    assert code == 0, stderr
    assert calls == ["python -m agent_system.comparisons.compare --out cmp --steps 2", "USR1", "scontrol requeue 1234"]
    assert stdout.splitlines()[-1] == (
        "MLMT compare job 1234: compare stopped early, its runs resumable (stop requested: 1); requeue"
    )


def test_compare_that_exits_75_on_its_own_is_requeued(tmp_path):
    # a preemption's SIGTERM reaches every process of the job: compare can stop before the script passes one on
    code, stdout, stderr, calls = _run(tmp_path, COMPARE, ["--out", "cmp"], warn=False, EXIT="75")
    assert code == 0, stderr
    assert calls[1:] == ["scontrol requeue 1234"] and "(stop requested: 0); requeue" in stdout


@pytest.mark.parametrize("status", ["0", "1"])
def test_compare_that_ends_on_its_own_is_not_requeued(status, tmp_path):
    code, _, stderr, calls = _run(tmp_path, COMPARE, ["--out", "cmp"], warn=False, EXIT=status)
    assert code == int(status) and len(calls) == 1, stderr
