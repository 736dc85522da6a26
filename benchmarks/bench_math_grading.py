"""Math grading throughput: RewardPool workers versus one process, and the cost of pathological responses.

Responses are built from the MATH / MATH-500 reference solutions in the shared data folder, in many answer
forms (boxed, "The answer is", \\dfrac, decimals, ``x = ...``, units, percents), and about half are made
wrong by perturbing the final answer.

Usage::

    python benchmarks/bench_math_grading.py                     # 2,000 responses, 2 workers
    python benchmarks/bench_math_grading.py --n 200 --workers 2 --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from pathlib import Path

from agent_system.rewards import RewardPool, compute_score
from agent_system.rewards.math_answer import last_boxed_content
from agent_system.rewards.math_reward import parse_gold


def _wrong(answer: str, rng: random.Random, others: list[str]) -> str:
    numbers = re.findall(r"\d+", answer)
    if numbers and rng.random() < 0.7:
        target = rng.choice(numbers)
        return answer.replace(target, str(int(target) + rng.randint(1, 9)), 1)
    return rng.choice(others)


def _render(answer: str, rng: random.Random) -> str:
    """The final answer written in one of several forms."""
    form = rng.randrange(7)
    if form == 0:
        return f"\\boxed{{{answer}}}"
    if form == 1:
        return f"The answer is ${answer}$."
    if form == 2:
        return "\\boxed{" + answer.replace("\\frac", "\\dfrac") + "}"
    if form == 3 and re.fullmatch(r"\\frac\{\d+\}\{\d+\}", answer):
        num, den = map(int, re.findall(r"\d+", answer))
        return f"\\boxed{{{num / den:.6f}}}"
    if form == 4:
        return f"so $x = \\boxed{{{answer}}}$"
    if form == 5 and re.fullmatch(r"\d+", answer):
        return f"\\boxed{{{answer}\\text{{ cm}}}}"
    return f"Final answer: $\\boxed{{{answer}}}$"


def build_items(data_dir: str, n: int, seed: int = 0) -> list[dict]:
    rows = []
    for name in ("math500/test.jsonl", "math/test.jsonl"):
        with open(os.path.join(data_dir, name)) as handle:
            rows += [json.loads(line) for line in handle]
    rng = random.Random(seed)
    rng.shuffle(rows)
    answers = [last_boxed_content(r["solution"]) or "0" for r in rows]
    items = []
    for row, gold in zip(rows[:n], answers[:n], strict=True):
        said = _wrong(gold, rng, answers) if rng.random() < 0.5 else gold
        body = row["solution"][: row["solution"].rfind("\\boxed")]
        items.append({"data_source": "math", "solution_str": body + _render(said, rng), "ground_truth": gold})
    for item in items:
        item["extra_info"] = None
    return items


def pathological(n: int) -> list[dict]:
    shapes = [
        "\\boxed{9^{9^{9}}}",
        "\\boxed{" + "1" * 100_000 + "}",
        "x" * 100_000 + "\\boxed{10^{10^{7}}}",
        "\\boxed{" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "}",
        "\\boxed{(x+1)^{100000}}",
    ]
    return [{"data_source": "math", "solution_str": shapes[i % len(shapes)], "ground_truth": "3", "extra_info": None}
            for i in range(n)]  # fmt: skip


def run_single(items: list[dict]) -> tuple[float, list[float]]:
    parse_gold.cache_clear()
    start = time.monotonic()
    scores = [compute_score(i["data_source"], i["solution_str"], i["ground_truth"])["score"] for i in items]
    return time.monotonic() - start, scores


def run_pool(pool: RewardPool, items: list[dict]) -> tuple[float, list[float]]:
    start = time.monotonic()
    scores = [r["score"] for r in pool.score(items)]
    return time.monotonic() - start, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="number of responses")
    parser.add_argument("--workers", type=int, default=2, help="RewardPool workers")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="per-item wall-clock limit of the pool")
    parser.add_argument("--n-pathological", type=int, default=10, help="pathological responses in the bad batch")
    parser.add_argument(
        "--data",
        default=os.environ.get("MLMT_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")),
    )
    args = parser.parse_args()

    items = build_items(args.data, args.n)
    single_s, single_scores = run_single(items)
    start = time.monotonic()
    with RewardPool(args.workers, args.timeout_s) as pool:
        pool.score(items[:2])  # wait for the workers to be up
        startup_s = time.monotonic() - start
        pool_s, pool_scores = run_pool(pool, items)
        clean = items[: max(50, args.n // 10)]
        clean_s, _ = run_pool(pool, clean)
        bad = clean[: len(clean) - args.n_pathological] + pathological(args.n_pathological)
        bad_s, bad_scores = run_pool(pool, bad)
        restarts = pool.num_restarts
    print(f"responses: {len(items)}, correct fraction: {sum(pool_scores) / len(items):.3f}")
    print(f"single-process / pool verdicts identical: {single_scores == pool_scores}")
    print("| mode | seconds | pairs/s |")
    print("|---|---|---|")
    print(f"| single process (main thread) | {single_s:.1f} | {len(items) / single_s:.0f} |")
    print(f"| RewardPool, {args.workers} workers | {pool_s:.1f} | {len(items) / pool_s:.0f} |")
    print(f"pool / single throughput ratio: {single_s / pool_s:.2f}x (pool startup {startup_s:.1f} s, not counted)")
    print(
        f"clean batch of {len(clean)}: {clean_s:.2f} s; same size with {args.n_pathological} pathological: "
        f"{bad_s:.2f} s (+{bad_s - clean_s:.2f} s; pathological scores {bad_scores[-args.n_pathological :]}, "
        f"worker restarts {restarts})"
    )


if __name__ == "__main__":
    main()
