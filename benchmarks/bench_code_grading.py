"""Code grading time per program: the current grader against an earlier one (default: the grader before the split).

Both grade the same MBPP reference solutions, one sandbox process per program, alternating program by program so
that the machine's load falls on both alike. The earlier grader is taken from git (``--baseline``, default the last
commit before the split, which put the expected values outside the sandbox) into a temporary folder and imported from
there; nothing in the project is patched.

Usage::

    python benchmarks/bench_code_grading.py                      # 200 MBPP tasks, 3 rounds
    python benchmarks/bench_code_grading.py --n 974 --rounds 1 --data ../shared/data/mbpp/mbpp.jsonl
    python benchmarks/bench_code_grading.py --baseline 6ed0b4f   # against the sandbox before issue 45's bounds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_system.rewards.code_sandbox import SandboxLimits, run_tests

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "383a85a"  # the commit before the split (the exploit tests were added on the old grader)


def load_baseline(revision: str):
    """The ``code_sandbox`` module of ``revision``, imported from a temporary folder (with its harness beside it)."""
    folder = Path(tempfile.mkdtemp(prefix="bench_code_grading_"))
    for name in ("code_sandbox.py", "sandbox_harness.py", "sandbox_isolation.py"):
        source = subprocess.run(
            ["git", "show", f"{revision}:agent_system/rewards/{name}"], cwd=ROOT, capture_output=True, text=True
        )
        if source.returncode != 0 and name == "sandbox_isolation.py":  # the sandbox's first stage, since issue 45
            continue
        if source.returncode != 0:
            raise SystemExit(f"--baseline {revision}: cannot read agent_system/rewards/{name}: {source.stderr.strip()}")
        (folder / name).write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("baseline_code_sandbox", folder / "code_sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/mbpp/mbpp.jsonl"), help="mbpp.jsonl")
    parser.add_argument("--n", type=int, default=200, help="tasks (the first n)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the tasks")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the grader to compare with")
    args = parser.parse_args(argv)
    baseline = load_baseline(args.baseline)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()][: args.n]
    limits = SandboxLimits(timeout_s=60.0, per_test_s=30.0)
    graders = {
        "before": lambda code, tests, setup: baseline.run_tests(code, tests, setup, baseline.SandboxLimits(60.0, 30.0)),
        "current": lambda code, tests, setup: run_tests(code, tests, setup, limits),
    }
    times = {name: [] for name in graders}
    passed = dict.fromkeys(graders, 0)
    for round_index in range(args.rounds):
        for k, row in enumerate(rows):
            code, setup = row["code"].replace("\r\n", "\n"), row.get("test_setup_code") or ""
            order = list(graders) if (k + round_index) % 2 == 0 else list(graders)[::-1]
            for name in order:
                start = time.perf_counter()
                result = graders[name](code, row["test_list"], setup)
                times[name].append(time.perf_counter() - start)
                passed[name] += result.all_passed
    print(f"{len(rows)} MBPP reference programs x {args.rounds} rounds, one sandbox process per program")
    print(f"{'grader':<8} {'mean ms':>9} {'median ms':>10} {'all passed':>11}")
    for name in graders:
        mean, median = 1000 * statistics.mean(times[name]), 1000 * statistics.median(times[name])
        print(f"{name:<8} {mean:>9.1f} {median:>10.1f} {passed[name]:>11}")
    ratio_mean = statistics.mean(times["current"]) / statistics.mean(times["before"])
    ratio_median = statistics.median(times["current"]) / statistics.median(times["before"])
    pairs = sorted(s / b for s, b in zip(times["current"], times["before"], strict=True))
    print(f"current / before: mean {ratio_mean:.3f}x, median {ratio_median:.3f}x, median of per-program ratios "
          f"{statistics.median(pairs):.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
