"""The PASS / FAIL checks of ``scripts/gpu_check.sh``, read from the folder its runs leave (tested on CPU).

    python scripts/gpu_check.py OUT --gpus N

``OUT`` holds one folder per run (``colocated``: two steps with validation and a checkpoint; ``resume``: the same
run resumed for a third step; ``split``: two GPUs, one level each, only with two GPUs), each with ``rc`` (the exit
status), ``metrics.jsonl`` (verl's file logger: ``{"step": N, "data": {...}}`` per line), ``run_plan.json`` (the
run plan the trainer wrote) and ``memory.csv`` (``nvidia-smi`` samples of the GPU's used MiB). One line is printed
per check, ``PASS``, ``FAIL`` or ``SKIP`` with the numbers; the exit status is 1 when a check failed.

The checks:

* exit status 0;
* weight pushes per level per step (``perf/weight_syncs/<level>``) equal one per weight version a generation needs
  that its servers do not hold (:func:`expected_pushes`): the servers of a new process hold none, each update of a
  level makes a new version, and a step generates (rollout), then updates the levels the plan updates, then
  validates where the plan validates;
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

LEVELS = ("ll", "hl")
MIB = 2**20


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped
    detail: str

    def line(self) -> str:
        status = "SKIP" if self.passed is None else "PASS" if self.passed else "FAIL"
        return f"{status} {self.name}: {self.detail}"


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """verl's file-logger lines merged per step: ``{step: {metric: value}}``."""
    steps: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def expected_pushes(steps: list[int], update_steps: dict[str, list[int]], validation_steps: list[int]) -> dict:
    """``{step: {level: pushes}}`` for one process that runs ``steps`` in order, one push per weight version needed.

    Each step generates with every level (the rollout), updates the levels in ``update_steps``, then validates (a
    generation again) on ``validation_steps``. A level's servers start without weights (dummy) and hold a version
    until the next push; a generation that needs another version costs one push.
    """
    version = dict.fromkeys(update_steps, 0)
    held: dict[str, int | None] = dict.fromkeys(update_steps, None)
    pushes = {}
    for step in steps:
        counts = dict.fromkeys(update_steps, 0)
        for phase in ("rollout", "update", "validation"):
            for level, updated in update_steps.items():
                if phase == "update":
                    version[level] += step in updated
                elif (phase == "rollout" or step in validation_steps) and held[level] != version[level]:
                    held[level] = version[level]
                    counts[level] += 1
        pushes[step] = counts
    return pushes


def check_exit(run: str, rc: int | None) -> Check:
    if rc is None:
        return Check(f"{run}: exit status", False, "the run did not finish (no exit status written)")
    return Check(f"{run}: exit status", rc == 0, f"{rc}" + ("" if rc == 0 else " (see its console.log)"))


def check_pushes(run: str, metrics: dict[int, dict[str, float]], plan: dict) -> list[Check]:
    """One check per step: each level's ``perf/weight_syncs/<level>`` against :func:`expected_pushes`."""
    steps = sorted(step for step, values in metrics.items() if any(k.startswith("perf/weight_syncs/") for k in values))
    if not steps:
        return [Check(f"{run}: pushes per step", False, "no step logged perf/weight_syncs/<level>")]
    levels = {level: plan["levels"][level]["update_steps"] for level in LEVELS if level in plan["levels"]}
    expected = expected_pushes(steps, levels, plan["validation_steps"])
    checks = []
    for step in steps:
        got = {level: metrics[step].get(f"perf/weight_syncs/{level}") for level in levels}
        want = {level: float(count) for level, count in expected[step].items()}
        text = ", ".join(f"{level} {_number(got[level])} (expected {want[level]:g})" for level in levels)
        checks.append(Check(f"{run}: pushes at step {step}", got == want, text))
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


def check_resume(metrics: dict[int, dict[str, float]], checkpoint_step: int, max_gap: float) -> list[Check]:
    """The resumed run restored the checkpoint of ``checkpoint_step`` (probe log-probs) and trained the next step."""
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
    return [gap, Check("resume: continues after the checkpoint", bool(later) and later[0] == next_step, text)]


def multi_gpu_skip(gpus: int) -> Check | None:
    """The line for the two-GPU case (split placement, one level per GPU) on a node with fewer than two GPUs."""
    if gpus >= 2:
        return None
    return Check("split: two GPUs, one level each", None, f"needs 2 GPUs, this node has {gpus}")


def run_checks(out: Path, gpus: int, max_gap: float, slack_gib: float, max_resume_gap: float) -> list[Check]:
    checks = []
    for run in ("colocated", "resume", "split"):
        folder = out / run
        if run == "resume" and not folder.is_dir():
            checks.append(Check("resume", False, "not run: the first run failed"))
        if not folder.is_dir():
            continue
        rc_file = folder / "rc"
        checks.append(check_exit(run, int(rc_file.read_text()) if rc_file.is_file() else None))
        plan = json.loads((folder / "run_plan.json").read_text()) if (folder / "run_plan.json").is_file() else None
        metrics = read_metrics(folder / "metrics.jsonl") if (folder / "metrics.jsonl").is_file() else {}
        if plan is None:
            checks.append(Check(f"{run}: run plan", False, f"{folder / 'run_plan.json'} is missing"))
            continue
        checks += check_pushes(run, metrics, plan)
        checks += check_logprob_gap(run, metrics, max_gap)
        if (folder / "memory.csv").is_file():
            checks.append(check_memory(run, peak_mib(folder / "memory.csv"), plan, slack_gib))
        if run == "resume":
            checkpoint = json.loads((out / "colocated" / "run_plan.json").read_text())["checkpoint_steps"][-1]
            checks += check_resume(metrics, checkpoint, max_resume_gap)
    skip = multi_gpu_skip(gpus)
    return checks + ([skip] if skip else [])


def _number(value: float | None) -> str:
    return "missing" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder scripts/gpu_check.sh wrote")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs on the node")
    parser.add_argument("--max-logprob-gap", type=float, default=0.05, help="mean |rollout - actor| per token")
    parser.add_argument("--memory-slack-gib", type=float, default=8.0, help="allowed above the run plan's estimate")
    parser.add_argument("--max-resume-gap", type=float, default=0.05, help="restored vs saved probe log-probs")
    args = parser.parse_args(argv)
    checks = run_checks(args.out, args.gpus, args.max_logprob_gap, args.memory_slack_gib, args.max_resume_gap)
    for check in checks:
        print(check.line())
    failed = sum(check.passed is False for check in checks)
    print(f"{'FAIL' if failed else 'PASS'} gpu_check: {failed} of {len(checks)} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
