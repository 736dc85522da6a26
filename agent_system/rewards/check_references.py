"""Score each row's ``reference_solution`` with the project's reward: the agreement rate with official labels.

Every disagreement is printed with its row, so it can be understood (a grader bug or a dataset defect).

Usage::

    python -m agent_system.rewards.check_references --input data/math500/test.parquet --workers 2
    python -m agent_system.rewards.check_references --input data/mbpp/all.parquet --workers 2 --timeout-s 15
"""

from __future__ import annotations

import argparse
import logging
import time

import pandas as pd

from agent_system.rewards.pool import RewardPool

logger = logging.getLogger(__name__)


def check_references(path: str, workers: int = 2, timeout_s: float = 10.0, limit: int | None = None) -> dict:
    """Scores the reference solutions of a verl parquet file against its ground truths.

    Args:
        path: A parquet file written by the preprocessors or the default-dataset generator.
        workers: RewardPool size.
        timeout_s: Per-item wall-clock limit.
        limit: Check only the first rows.

    Returns:
        ``{"rows", "agree", "rate", "seconds", "disagreements": [(row, pred, gold, error), ...]}``.
    """
    frame = pd.read_parquet(path)
    if limit is not None:
        frame = frame.head(limit)
    items = [
        {
            "data_source": row.data_source,
            "solution_str": row.extra_info["reference_solution"],
            "ground_truth": row.reward_model["ground_truth"],
            "extra_info": dict(row.extra_info),
        }
        for row in frame.itertuples()
    ]
    start = time.monotonic()
    with RewardPool(workers, timeout_s) as pool:
        results = pool.score(items)
    seconds = time.monotonic() - start
    disagreements = [
        (i, r["pred"][:200], items[i]["ground_truth"][:200], r["error"]) for i, r in enumerate(results) if not r["acc"]
    ]
    agree = len(items) - len(disagreements)
    rate = agree / len(items) if items else 0.0
    return {"rows": len(items), "agree": agree, "rate": rate, "seconds": seconds, "disagreements": disagreements}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="verl parquet file")
    parser.add_argument("--workers", type=int, default=2, help="scoring worker processes")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="wall-clock limit per row")
    parser.add_argument("--limit", type=int, default=None, help="check only the first rows")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    report = check_references(args.input, args.workers, args.timeout_s, args.limit)
    for row, pred, gold, error in report["disagreements"]:
        logger.info("row %d: pred=%r gold=%r error=%s", row, pred, gold, error)
    logger.info(
        "%s: %d/%d references agree (%.2f%%) in %.1f s",
        args.input, report["agree"], report["rows"], 100 * report["rate"], report["seconds"],
    )  # fmt: skip


if __name__ == "__main__":
    main()
