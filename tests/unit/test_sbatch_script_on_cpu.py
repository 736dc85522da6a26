"""mlmt-configs/submit_mlmt.sbatch: the allocation's counts reach Ray and each `srun`; the Ray nodes are stopped even
when an `srun` misses the stop signal; a Ray node whose start fails is started again, up to 3 times, before the
trainer starts (the job fails naming the node after the third).

The batch script runs through bash with stand-ins for `srun`, `scontrol`, `ray` and the Python (each logs its argv; a
Ray node's `srun` runs until it is signalled), and Slurm's variables of a 2-node job. What is checked is the script's
own logic; the real Slurm run is tests/integration/test_slurm_sbatch_on_cpu.py.

Why a stand-in `srun` that misses a SIGTERM: a real one can miss a signal that comes while it is still launching its
job step, and then runs on (measured on Slurm 22.05: 1 of 26 signals sent 5-30 ms after its start). A CI run met it:
the trainer ended at once, the script's clean-up signalled a worker's `srun` that had just started, and its bare `wait`
held the job until its time limit. That timing cannot be produced on demand with a real Slurm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.external  # runs the sbatch script with stub srun and ray processes

REPO = Path(__file__).resolve().parents[1].parent
SCRIPT = REPO / "mlmt-configs" / "submit_mlmt.sbatch"

STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "scontrol show hostnames"*) printf 'n1\\nn2\\n' ;;
  srun*hostname*) echo 10.0.0.1 ;;
  "ray status"*)  # the nodes whose stand-in runs, in `ray status`'s form; with none, waits as for a GCS not up
    [ -z "$STATUS_WAITS_FOR_A_HEAD" ] || [ -s "$CALLS.nodes" ] || sleep "$STATUS_WAITS_FOR_A_HEAD"
    echo "Active:"
    for pid in $(cat "$CALLS.nodes" 2>/dev/null); do ! kill -0 "$pid" 2>/dev/null || echo " 1 node_$pid"; done
    echo "Pending:" ;;
  python*)  # the trainer: ends once both Ray nodes run (a node signalled before it set its trap is not the case tested)
    for _ in $(seq 300); do [ "$(wc -l < "$CALLS.nodes" 2>/dev/null || echo 0)" -ge 2 ] && break; sleep 0.1; done ;;
  srun*" start "*)  # a Ray node: runs until stopped; misses $MISSED SIGTERMs first (all of them: "all")
    case " $* " in *" --head "*) kind=HEAD ;; *) kind=NODE ;; esac
    echo "$kind" >> "$CALLS.starts"
    failing="FAILED_STARTS_$kind"  # its first N starts exit during start-up ("all": every one), as Ray's does
    if [ "${!failing}" = all ] || [ "$(grep -c "^$kind$" "$CALLS.starts")" -le "${!failing}" ]; then
      sleep 0.5
      exit 1
    fi
    if [ "$kind" = HEAD ] && [ -n "$HEAD_DIES_AFTER" ]; then  # joins, then ends while the other nodes start
      echo $$ >> "$CALLS.nodes"
      # after the other node's start: a fixed time from its own start raced the script's first poll on a loaded
      # machine (a head dead before that poll looked like a failed start, and was started again)
      for _ in $(seq 600); do grep -qx NODE "$CALLS.starts" && break; sleep 0.1; done
      sleep "$HEAD_DIES_AFTER"
      exit 1
    fi
    [ "$kind" = HEAD ] || sleep "$NODE_JOIN_DELAY"
    missed=0
    on_term() {
      echo "TERM $$" >> "$CALLS.terms"
      missed=$((missed + 1))
      [ "$MISSED" = all ] || [ "$missed" -le "$MISSED" ] || exit 143
    }
    trap on_term TERM
    echo $$ >> "$CALLS.nodes"
    for _ in $(seq 3000); do sleep 0.1; done ;;
esac
exit 0
"""


# awk, except that the script's first count of joined Ray nodes prints nothing, as when the job's end (Slurm's time
# limit) stops that pipe: a job of the sbatch integration test, on a loaded machine, logged "[: : integer expression
# expected" there
CUT_FIRST_COUNT = """#!/usr/bin/env bash
case "$*" in *node_*) if [ ! -e "$CALLS.cut" ]; then touch "$CALLS.cut"; cat > /dev/null; exit 143; fi ;; esac
exec {awk} "$@"
"""


def _run(
    tmp_path: Path, timeout: float, stand_ins: dict[str, str] | None = None, **env_extra: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """Runs the script with the stand-ins (``stand_ins``: more of them, by command name) and Slurm's variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {**dict.fromkeys(("srun", "scontrol", "ray", "python"), STAND_IN), **(stand_ins or {})}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "MLMT_PYTHON": str(bin_dir / "python"),
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "TMPDIR": str(tmp_path),
        "MISSED": "0",
        "FAILED_STARTS_HEAD": "0",
        "FAILED_STARTS_NODE": "0",
        "HEAD_DIES_AFTER": "",
        "NODE_JOIN_DELAY": "0",
        "STATUS_WAITS_FOR_A_HEAD": "",
        **env_extra,
    }
    result = subprocess.run(["bash", str(SCRIPT), "trainer.total_training_steps=1"], env=env, capture_output=True,
                            text=True, timeout=timeout)  # fmt: skip
    return result, calls


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # also when it exits between the lookup and the status
        return False


def _running(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 5  # a killed stand-in's last `sleep 0.1` ends within a moment
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _node_pids(calls: Path) -> list[int]:
    return [int(pid) for pid in Path(f"{calls}.nodes").read_text().split()]


def _terms(calls: Path) -> list[str]:
    terms = Path(f"{calls}.terms")
    return terms.read_text().splitlines() if terms.exists() else []


def test_an_srun_that_missed_the_stop_signal_is_asked_again_and_the_job_ends(tmp_path):
    # before the fix the script's `wait` blocked here until the time-out (the job until its time limit)
    result, calls = _run(tmp_path, timeout=40, MISSED="1")
    assert result.returncode == 0, result.stderr
    nodes = _node_pids(calls)
    assert len(nodes) == 2  # the head and the second node
    assert sorted(_terms(calls)) == sorted(f"TERM {pid}" for pid in nodes for _ in range(2))  # missed, then ended
    assert not _running(nodes)


@pytest.mark.slow(seconds=60)
def test_an_srun_that_ignores_every_stop_signal_is_killed_after_the_grace(tmp_path):
    result, calls = _run(tmp_path, timeout=90, MISSED="all")
    assert result.returncode == 0, result.stderr
    nodes = _node_pids(calls)
    assert len(nodes) == 2
    assert len(_terms(calls)) == 2 * 10  # asked every 5 s for 45 s, then killed
    assert not _running(nodes)


def _starts(calls: Path) -> list[str]:
    return Path(f"{calls}.starts").read_text().split()


def _trainer_ran(calls: Path) -> bool:
    return any(call.startswith("python") for call in calls.read_text().splitlines())


def test_a_ray_head_that_exits_during_start_up_is_started_again_and_the_job_runs(tmp_path):
    # Ray's raylet aborts when its dashboard agent is slower than 15 s (a CI run's second start): before, the job
    # failed at once (the head's exit) or, when `ray status` had answered first, ran a trainer without a cluster
    result, calls = _run(tmp_path, timeout=40, FAILED_STARTS_HEAD="1")
    assert result.returncode == 0, result.stderr
    assert _starts(calls) == ["HEAD", "HEAD", "NODE"]  # the second node starts once the head has joined
    retried = "MLMT job 1234: the Ray head on n1 exited during its start-up (start 1 of 3: its raylet waits"
    assert retried in result.stdout
    assert "start 1 on 2 node(s)" in result.stdout and _trainer_ran(calls)


def test_a_count_of_joined_nodes_that_printed_nothing_is_not_taken_for_a_joined_head(tmp_path):
    # before, "[ '' -lt 1 ]" failed and its `|| return 0` took the empty count for "all joined": the second node
    # started beside a head whose start had failed, and the job ended ("the Ray head on n1 exited while the other
    # nodes started")
    cut_awk = CUT_FIRST_COUNT.replace("{awk}", shutil.which("awk"))
    result, calls = _run(tmp_path, timeout=40, stand_ins={"awk": cut_awk}, FAILED_STARTS_HEAD="1")
    assert Path(f"{calls}.cut").exists()  # the first count printed nothing
    assert result.returncode == 0, result.stderr
    assert "integer expression expected" not in result.stderr
    assert _starts(calls) == ["HEAD", "HEAD", "NODE"]
    assert _trainer_ran(calls)


def test_a_head_whose_start_failed_is_started_again_while_ray_status_still_waits_for_it(tmp_path):
    # a real `ray status` waits about 45 s for a GCS that is not up; before, each poll waited it out (the sbatch
    # integration test's job, on a loaded machine, spent its time limit on its first start), and here the job waited
    # 300 s for the first answer
    result, calls = _run(tmp_path, timeout=90, FAILED_STARTS_HEAD="1", STATUS_WAITS_FOR_A_HEAD="300")
    assert result.returncode == 0, result.stderr
    assert _starts(calls) == ["HEAD", "HEAD", "NODE"]
    assert _trainer_ran(calls)


def test_a_ray_node_that_exits_during_start_up_is_started_again(tmp_path):
    result, calls = _run(tmp_path, timeout=40, FAILED_STARTS_NODE="2")
    assert result.returncode == 0, result.stderr
    assert _starts(calls) == ["HEAD", "NODE", "NODE", "NODE"]
    assert "the Ray node on n2 exited during its start-up (start 2 of 3" in result.stdout
    assert _trainer_ran(calls)


def test_a_ray_head_that_exits_at_every_start_fails_the_job_before_the_trainer(tmp_path):
    result, calls = _run(tmp_path, timeout=40, FAILED_STARTS_HEAD="all")
    assert result.returncode == 1
    assert _starts(calls) == ["HEAD"] * 3
    assert "MLMT job 1234: the Ray head on n1 exited during its start-up 3 times; see its output above" in result.stderr
    assert not _trainer_ran(calls)


def test_a_ray_node_that_exits_at_every_start_fails_the_job_before_the_trainer(tmp_path):
    result, calls = _run(tmp_path, timeout=40, FAILED_STARTS_NODE="all")
    assert result.returncode == 1
    assert _starts(calls) == ["HEAD"] + ["NODE"] * 3
    assert "MLMT job 1234: the Ray node on n2 exited during its start-up 3 times" in result.stderr
    assert not _trainer_ran(calls)
    assert not _running(_node_pids(calls))  # the head was stopped


def test_a_ray_head_that_exits_while_the_other_nodes_start_fails_the_job(tmp_path):
    # started again, it would be a new cluster that the nodes already started could not join
    result, calls = _run(tmp_path, timeout=40, HEAD_DIES_AFTER="1", NODE_JOIN_DELAY="30")
    assert result.returncode == 1
    assert "MLMT job 1234: the Ray head on n1 exited while the other nodes started" in result.stderr
    assert _starts(calls) == ["HEAD", "NODE"] and not _trainer_ran(calls)


def test_ray_gets_the_allocations_cpus_and_gpus_and_srun_its_cpus(tmp_path):
    result, calls = _run(tmp_path, timeout=60, SLURM_CPUS_PER_TASK="8", SLURM_GPUS_PER_NODE="h100:4")
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    starts = [call for call in lines if call.startswith("srun") and " start " in call]
    assert len(starts) == 2, starts  # the head and the second node
    for call in starts:
        assert "--cpus-per-task=8" in call and "--num-cpus=8" in call and "--num-gpus=4" in call, call
    assert any(call.startswith("python -m verl.trainer.main_mlmt trainer.nnodes=2") for call in lines), lines


def test_without_slurm_counts_ray_counts_the_node_itself(tmp_path):
    result, calls = _run(tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    starts = [call for call in calls.read_text().splitlines() if call.startswith("srun") and " start " in call]
    assert len(starts) == 2 and not any("--num-" in call or "--cpus-per-task" in call for call in starts), starts
