"""The PASS / FAIL checks of ``scripts/gpu_check.sh``, read from the folder its runs leave (tested on CPU).

    python scripts/gpu_check.py OUT --gpus N

``OUT`` holds one folder per run (``colocated``: two steps with validation and a checkpoint; ``resume``: the same
run resumed for a third step; ``split``: two GPUs, one level each, only with two GPUs), each with ``rc`` (the exit
status), ``metrics.jsonl`` (verl's file logger: ``{"step": N, "data": {...}}`` per line), ``run_plan.json`` (the
run plan the trainer wrote) and ``memory.csv`` (``nvidia-smi`` samples of the GPU's used MiB). One line is printed
per check, ``PASS``, ``FAIL``, ``SKIP`` or ``TIMEOUT`` with the numbers; the exit status is 1 when a check failed,
else 75 (:data:`EXIT_STOPPED`: run again with more time) when a run timed out, else 0.

The checks:

* exit status 0. A run that reached ``gpu_check.sh``'s ``--run-timeout`` (``timeout`` exits 124; 137 when the
  trainer was killed after the grace; the trainer's own 75, :data:`EXIT_STOPPED`, when a stop signal ended it with a
  checkpoint) is reported as ``TIMEOUT ... timed out at step N`` (the last step its history logged), not as a
  failure; the checks of the steps it logged still run, and the resume, which ``gpu_check.sh`` then does not start,
  is a SKIP with that reason; a run ``--budget`` left too little time to start (its folder holds ``not_run``, the
  seconds left) is ``TIMEOUT ... not started`` too;
* weight pushes per level per step (``perf/weight_syncs/<level>``) equal those the trainer's own rules make
  (:func:`agent_system.levels.weight_sync.pushes_per_step`, the table of docs/ARCHITECTURE.md, "Weight syncs"): one
  per weight version a generation needs that its servers do not hold, where a new process's servers hold none; a
  sleep for training costs none (``gpu_check.sh``'s (tH, tL) = (1, 2) leaves a level idle at every step: under
  ``colocated`` it sleeps at vLLM level 1 and keeps its weights);
* the idle level kept its weights: for a level that slept at level 1 and trains at a later step of the same run,
  its pushes at the steps of those sleeps as the rules expect (none at its wake-ups) and the rollout-vs-actor
  log-prob gap of the step that trains it (whose rollout ran on the weights the sleeps kept) at most
  ``--max-logprob-gap``;
* after each push, the rollout-vs-actor log-prob gap of each level (``<level>/rollout_actor_logprob_diff_mean``:
  the actor re-scoring the tokens its servers sampled) at most ``--max-logprob-gap``: servers that kept stale or
  dummy weights sample with other log-probs;
* the peak used memory of the GPU at most the run plan's estimate for its device plus ``--memory-slack-gib`` (what
  the estimate leaves out: activations, CUDA contexts, NCCL buffers);
* the resume: it continues at the step after the checkpoint, and the restored models' log-probs on the probe equal
  those saved (``resume/<level>_logprob_max_abs_diff`` at most ``--max-resume-gap``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # agent_system where the venv lacks the project
from agent_system.levels.weight_sync import (  # noqa: E402  (the trainer's rules: one home)
    keeps_weights_asleep,
    pushes_per_step,
    sleeps_for_training,
)
from agent_system.trainer.stop_request import EXIT_STOPPED  # noqa: E402

LEVELS = ("ll", "hl")
MIB = 2**20
PLACEMENT = {"colocated": "colocated", "resume": "colocated", "split": "split"}  # as gpu_check.sh runs them
# the exit statuses of a run that reached its time limit, and what each says
TIMED_OUT = {
    124: "timeout's status: the trainer got SIGTERM at --run-timeout and ended within the grace",
    137: "killed with SIGKILL at --run-timeout + the grace: the stop-and-checkpoint did not finish",
    EXIT_STOPPED: f"the trainer's {EXIT_STOPPED}: stopped on a signal after its step, with a checkpoint",
}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped
    detail: str
    timed_out: bool = False  # a run's exit status: it reached its time limit (passed is None)

    def line(self) -> str:
        status = "TIMEOUT" if self.timed_out else "SKIP" if self.passed is None else "PASS" if self.passed else "FAIL"
        return f"{status} {self.name}: {self.detail}"


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """verl's file-logger lines merged per step: ``{step: {metric: value}}``."""
    steps: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def logged_steps(metrics: dict[int, dict[str, float]]) -> list[int]:
    """The steps a run logged (its history): those with ``perf/weight_syncs/<level>``, step 0 being the validation
    before training (a resumed run's checkpoint step, which logs only ``resume/*``, is not one of its steps)."""
    return sorted(step for step, values in metrics.items() if any(k.startswith("perf/weight_syncs/") for k in values))


def check_exit(run: str, rc: int | None, last_step: int | None = None, total_steps: int | None = None) -> Check:
    """The run's exit status: PASS on 0; TIMEOUT (not a failure) on a status of :data:`TIMED_OUT`, naming the last
    step the run logged (``last_step``, None: none) of ``total_steps``; FAIL otherwise."""
    name = f"{run}: exit status"
    if rc is None:
        return Check(name, False, "the run did not finish (no exit status written)")
    if rc in TIMED_OUT:
        of = "" if total_steps is None else f" of {total_steps}"
        at = "before its first step" if last_step is None else f"at step {last_step}{of}"
        return Check(name, None, f"timed out {at} ({rc}: {TIMED_OUT[rc]})", timed_out=True)
    return Check(name, rc == 0, f"{rc}" + ("" if rc == 0 else " (see its console.log)"))


def not_started(run: str, left_s: str) -> Check:
    """A run gpu_check.sh did not start because ``--budget`` left it under a minute: counted as timed out (exit 75)."""
    return Check(
        f"{run}: exit status", None, f"not started: the budget left {left_s} s (raise --budget)", timed_out=True
    )


def check_pushes(run: str, metrics: dict[int, dict[str, float]], plan: dict) -> list[Check]:
    """One check per step: each level's ``perf/weight_syncs/<level>`` against the trainer's rules
    (:func:`agent_system.levels.weight_sync.pushes_per_step`) for the plan's updates and validations."""
    steps = logged_steps(metrics)
    if not steps:
        return [Check(f"{run}: pushes per step", False, "no step logged perf/weight_syncs/<level>")]
    levels = {level: plan["levels"][level]["update_steps"] for level in LEVELS if level in plan["levels"]}
    expected = pushes_per_step(steps, levels, plan["validation_steps"])
    checks = []
    for step in steps:
        got = {level: metrics[step].get(f"perf/weight_syncs/{level}") for level in levels}
        want = {level: float(count) for level, count in expected[step].items()}
        text = ", ".join(f"{level} {_number(got[level])} (expected {want[level]:g})" for level in levels)
        checks.append(Check(f"{run}: pushes at step {step}", got == want, text))
    return checks


def check_idle_levels(
    run: str, metrics: dict[int, dict[str, float]], plan: dict, placement: str, max_gap: float
) -> list[Check]:
    """One check per level that slept keeping its weights (vLLM level 1: a step that trained the other level on its
    devices, :func:`agent_system.levels.weight_sync.keeps_weights_asleep`) and trains at a later logged step of the
    run: its pushes at the steps of those sleeps equal the rules' (no push at a wake-up), and the log-prob gap of the
    step that trains it, whose rollout ran on the weights the sleeps kept, is at most ``max_gap``."""
    steps = logged_steps(metrics)
    levels = {level: plan["levels"][level]["update_steps"] for level in LEVELS if level in plan["levels"]}
    expected = pushes_per_step(steps, levels, plan["validation_steps"])
    checks = []
    for level, updates in levels.items():
        slept = []  # the steps since the level's last update at which it slept keeping its weights
        for step in steps:
            active = [other for other in levels if step in levels[other]]
            if step in updates and slept:
                got = {s: metrics[s].get(f"perf/weight_syncs/{level}") for s in slept}
                pushes = ", ".join(f"{_number(got[s])} at step {s} (expected {expected[s][level]})" for s in slept)
                gap = metrics[step].get(f"{level}/rollout_actor_logprob_diff_mean")
                passed = gap is not None and gap <= max_gap and all(got[s] == expected[s][level] for s in slept)
                name = f"{run}: {level} kept its weights asleep at step(s) {', '.join(map(str, slept))}"
                text = f"pushes {pushes}; log-prob gap at step {step} {_number(gap)} (at most {max_gap:g})"
                checks.append(Check(name, passed, text))
            if step in updates:
                slept = []
            elif sleeps_for_training(level, active, placement, False) and keeps_weights_asleep(level, active):
                slept.append(step)
    return checks


def check_logprob_gap(run: str, metrics: dict[int, dict[str, float]], max_gap: float) -> list[Check]:
    """One check per step and level: the mean rollout-vs-actor log-prob gap of the tokens the servers sampled."""
    checks = []
    for step in sorted(metrics):
        for level in LEVELS:
            mean = metrics[step].get(f"{level}/rollout_actor_logprob_diff_mean")
            if mean is None:
                continue
            top = metrics[step].get(f"{level}/rollout_actor_logprob_diff_max")
            text = f"mean {mean:.2e} (at most {max_gap:g}), max {_number(top)}"
            checks.append(Check(f"{run}: {level} rollout-vs-actor log-prob gap at step {step}", mean <= max_gap, text))
    if not checks:
        checks.append(Check(f"{run}: rollout-vs-actor log-prob gap", False, "no step logged the gap of a level"))
    return checks


def peak_mib(path: Path) -> int | None:
    """The largest ``nvidia-smi`` sample (MiB) in ``path`` (one number per line), None without one."""
    samples = [int(line.split(",")[0]) for line in path.read_text().splitlines() if line.strip().isdigit()]
    return max(samples, default=None)


def check_memory(run: str, peak: int | None, plan: dict, slack_gib: float) -> Check:
    """The GPU's peak used memory against the plan's estimate of the device's sum (``memory.sums``)."""
    name = f"{run}: peak GPU memory vs. the run plan's estimate"
    memory = plan.get("memory")
    if not memory or not memory.get("sums") or memory["sums"][0].get("total") is None:
        reason = plan.get("memory_unavailable") or "run_plan.json has no total for the device"
        return Check(name, False, f"no estimate: {reason}")
    if peak is None:
        return Check(name, False, "no nvidia-smi sample was recorded")
    estimate = max(device_sum["total"] for device_sum in memory["sums"]) / MIB
    limit = estimate + slack_gib * 1024
    text = f"peak {peak} MiB, estimate {estimate:.0f} MiB + {slack_gib:g} GiB not estimated = {limit:.0f} MiB"
    return Check(name, peak <= limit, text)


def check_resume(
    metrics: dict[int, dict[str, float]], checkpoint_step: int, max_gap: float, timed_out: bool = False
) -> list[Check]:
    """The resumed run restored the checkpoint of ``checkpoint_step`` (probe log-probs) and trained the next step
    (a SKIP when it reached its time limit before that step: ``timed_out``)."""
    restored = {key: value for key, value in metrics.get(checkpoint_step, {}).items() if key.startswith("resume/")}
    if not restored:
        gap = Check("resume: restored log-probs", False, f"no resume/* metric at step {checkpoint_step}")
    else:
        worst = max(restored.values())
        text = ", ".join(f"{key} {value:.2e}" for key, value in sorted(restored.items())) + f" (at most {max_gap:g})"
        gap = Check("resume: restored log-probs", worst <= max_gap, text)
    later = sorted(step for step in metrics if step > checkpoint_step)
    next_step = checkpoint_step + 1
    text = f"steps after the checkpoint: {later or 'none'} (expected to start at {next_step})"
    if timed_out and not later:
        return [gap, Check("resume: continues after the checkpoint", None, f"timed out before step {next_step}")]
    return [gap, Check("resume: continues after the checkpoint", bool(later) and later[0] == next_step, text)]


def multi_gpu_skip(gpus: int) -> Check | None:
    """The line for the two-GPU case (split placement, one level per GPU) on a node with fewer than two GPUs."""
    if gpus >= 2:
        return None
    return Check("split: two GPUs, one level each", None, f"needs 2 GPUs, this node has {gpus}")


def run_checks(out: Path, gpus: int, max_gap: float, slack_gib: float, max_resume_gap: float) -> list[Check]:
    checks = []
    first_timeout = None  # the first run's TIMEOUT line: why gpu_check.sh did not start the resume
    for run in ("colocated", "resume", "split"):
        folder = out / run
        if run == "resume" and not folder.is_dir():
            if (out / "colocated" / "not_run").is_file():
                checks.append(Check("resume", None, "not run: the first run was not started"))
            elif first_timeout is not None:
                reason = f"not run: the first run {first_timeout.detail.split(' (')[0]} (raise --run-timeout)"
                checks.append(Check("resume", None, reason))
            else:
                checks.append(Check("resume", False, "not run: the first run failed"))
        if not folder.is_dir():
            continue
        if (folder / "not_run").is_file():  # gpu_check.sh --budget: too little time left to start it
            left = (folder / "not_run").read_text().strip()
            checks.append(not_started(run, left))
            continue
        rc_file = folder / "rc"
        plan = json.loads((folder / "run_plan.json").read_text()) if (folder / "run_plan.json").is_file() else None
        metrics = read_metrics(folder / "metrics.jsonl") if (folder / "metrics.jsonl").is_file() else {}
        steps = logged_steps(metrics)
        rc = int(rc_file.read_text()) if rc_file.is_file() else None
        exit_check = check_exit(run, rc, steps[-1] if steps else None, plan and plan.get("total_steps"))
        checks.append(exit_check)
        if run == "colocated" and exit_check.timed_out:
            first_timeout = exit_check
        if plan is None:
            checks.append(Check(f"{run}: run plan", False, f"{folder / 'run_plan.json'} is missing"))
            continue
        if steps or not exit_check.timed_out:  # a run stopped before its first step has no step to check
            checks += check_pushes(run, metrics, plan)
            checks += check_idle_levels(run, metrics, plan, PLACEMENT[run], max_gap)
            checks += check_logprob_gap(run, metrics, max_gap)
        if gpus == 0:  # gpu_check.sh --cpu: the rehearsal samples no memory
            checks.append(Check(f"{run}: peak GPU memory vs. the run plan's estimate", None, "no GPU (--cpu)"))
        elif (folder / "memory.csv").is_file():
            checks.append(check_memory(run, peak_mib(folder / "memory.csv"), plan, slack_gib))
        if run == "resume":
            checkpoint = json.loads((out / "colocated" / "run_plan.json").read_text())["checkpoint_steps"][-1]
            checks += check_resume(metrics, checkpoint, max_resume_gap, exit_check.timed_out)
    skip = multi_gpu_skip(gpus)
    return checks + ([skip] if skip else [])


def _number(value: float | None) -> str:
    return "missing" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder scripts/gpu_check.sh wrote")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs on the node (0: gpu_check.sh --cpu)")
    parser.add_argument("--max-logprob-gap", type=float, default=0.05, help="mean |rollout - actor| per token")
    parser.add_argument("--memory-slack-gib", type=float, default=8.0, help="allowed above the run plan's estimate")
    parser.add_argument("--max-resume-gap", type=float, default=0.05, help="restored vs saved probe log-probs")
    args = parser.parse_args(argv)
    checks = run_checks(args.out, args.gpus, args.max_logprob_gap, args.memory_slack_gib, args.max_resume_gap)
    for check in checks:
        print(check.line())
    failed = sum(check.passed is False for check in checks)
    timed_out = [check.name.split(":")[0] for check in checks if check.timed_out]
    if failed or not timed_out:
        print(f"{'FAIL' if failed else 'PASS'} gpu_check: {failed} of {len(checks)} checks failed")
        return 1 if failed else 0
    print(
        f"TIMEOUT gpu_check: 0 of {len(checks)} checks failed, but {' and '.join(timed_out)} timed out or did not"
        " start: the later steps were not checked (raise --run-timeout or --budget)"
    )
    return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
