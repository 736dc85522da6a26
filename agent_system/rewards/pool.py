"""RewardPool: score batches in worker processes with a wall-clock limit per item enforced from outside.

Each worker is a ``spawn``-ed process (safe to create from a threaded process such as a Ray actor) that
runs :func:`agent_system.rewards.scoring.compute_score` in its main thread, so math-verify's SIGALRM
timeouts work and gold parses are cached per worker. The parent hands one item at a time to an idle
worker; a worker that overruns the limit is killed and replaced, and its item scores 0 with error
``"timeout"``. A worker that dies (e.g. a segfault in a C extension) is replaced the same way.

Items of a YAML-defined task (data source ``yaml_task``) go to the workers in batches of
:data:`agent_system.rewards.yaml_reward.BATCH_SIZE`: one sandbox run grades a batch (the limit then applies to the
batch). Responses that such a task's functions failed on (an exception, a timeout, a non-number) score 0 and are
counted: one warning per :meth:`RewardPool.score` call gives the count and the first errors; ``yaml_failures``
sums them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)

_READY = "ready"


def _worker_main(conn: Connection, timeout_s: float, judge, sandbox: str) -> None:
    """Worker loop: receive ``(index, item)``, send back ``(index, result)``; ``None`` means stop."""
    from agent_system.rewards.code_sandbox import SandboxLimits
    from agent_system.rewards.scoring import compute_score

    # keep math-verify's own timeouts and the sandbox inside the parent's wall-clock limit
    inner_s = max(1.0, timeout_s / 3)
    limits = SandboxLimits.within(timeout_s, sandbox)
    conn.send(_READY)
    while True:
        message = conn.recv()
        if message is None:
            return
        index, item = message
        if "batch" in item:
            conn.send((index, _score_yaml_batch(item["batch"], limits)))
            continue
        try:
            result = compute_score(
                item["data_source"],
                item["solution_str"],
                item["ground_truth"],
                item.get("extra_info"),
                timeout_s=inner_s,
                judge=None if item.get("rules_only") else judge,  # leak candidates (rewards/leak.py): rules only
                sandbox_limits=limits,
                prompt_str=item.get("prompt_str"),
            )
            result = {
                "score": min(1.0, max(0.0, float(result["score"]))),
                "acc": bool(result["acc"]),
                "pred": str(result.get("pred") or ""),
                "error": result.get("error"),
            }
        except Exception as exc:  # a malformed item must not take the worker down
            result = _failed(f"{type(exc).__name__}: {exc}"[:300])
        conn.send((index, result))


def _score_yaml_batch(items: list[dict], limits) -> list[dict]:
    from agent_system.rewards.yaml_reward import score_batch

    try:
        results = score_batch(items, limits)
    except Exception as exc:  # a malformed item must not take the worker down
        return [_failed(f"{type(exc).__name__}: {exc}"[:300]) for _ in items]
    return [{key: result[key] for key in ("score", "acc", "pred", "error")} for result in results]


def _jobs(items: list[dict]) -> list[tuple[list[int], dict]]:
    """The work units of a call: ``([index], item)``, or ``(indices, {"batch": items})`` for yaml_task items."""
    from agent_system.rewards.yaml_reward import BATCH_SIZE, DATA_SOURCE

    yaml = [i for i, item in enumerate(items) if item.get("data_source") == DATA_SOURCE]
    jobs = [([i], item) for i, item in enumerate(items) if item.get("data_source") != DATA_SOURCE]
    for start in range(0, len(yaml), BATCH_SIZE):
        chunk = yaml[start : start + BATCH_SIZE]
        jobs.append((chunk, {"batch": [items[i] for i in chunk]}))
    return jobs


def _failed(error: str) -> dict:
    return {"score": 0.0, "acc": False, "pred": "", "error": error}


class _Worker:
    """One worker process with its pipe and the item it is busy with."""

    def __init__(self, ctx, timeout_s: float, judge, sandbox: str) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child_conn, timeout_s, judge, sandbox), daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False
        self.index: int | None = None  # the job (a position in RewardPool.score's list of jobs) it is busy with
        self.deadline = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class RewardPool:
    """A pool of scoring workers that never stalls a training step.

    Args:
        num_workers: Number of worker processes.
        timeout_s: Wall-clock limit per item, counted from when a ready worker receives it.
        judge: Optional :class:`agent_system.rewards.judge.JudgeConfig` passed to every worker.
        sandbox: The code sandbox's isolation, ``isolated`` or ``none`` (``mlmt.reward.sandbox``,
            :attr:`agent_system.rewards.code_sandbox.SandboxLimits.isolation`).
        start_method: ``"spawn"`` (default) or ``"forkserver"``; never ``fork`` (unsafe in threaded parents).

    Example:
        >>> with RewardPool(num_workers=2, timeout_s=10) as pool:
        ...     results = pool.score([{"data_source": "arith", "solution_str": "\\\\boxed{12}",
        ...                            "ground_truth": "12", "extra_info": None}])
    """

    def __init__(
        self, num_workers: int, timeout_s: float, judge=None, start_method: str = "spawn", sandbox: str = "isolated"
    ) -> None:
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError("num_workers must be >= 1 and timeout_s > 0")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError("start_method must be 'spawn' or 'forkserver'")
        self.timeout_s = float(timeout_s)
        self._judge, self._sandbox = judge, sandbox
        self._ctx = mp.get_context(start_method)
        self._workers = [_Worker(self._ctx, self.timeout_s, judge, sandbox) for _ in range(num_workers)]
        self.num_restarts = 0
        self.yaml_failures = 0  # yaml_task responses scored 0 on an error of the task's functions, over all calls
        self._startup_failures = 0

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _replace(self, position: int) -> None:
        self._workers[position].kill()
        self._workers[position] = _Worker(self._ctx, self.timeout_s, self._judge, self._sandbox)
        self.num_restarts += 1

    def score(self, items: list[dict]) -> list[dict]:
        """Scores items in parallel, preserving their order.

        Args:
            items: Dicts with ``data_source``, ``solution_str``, ``ground_truth`` and ``extra_info``.

        Returns:
            One ``{"score", "acc", "pred", "error"}`` dict per item; an item that overruns the limit scores 0
            with error ``"timeout"``, one whose worker crashed scores 0 with error ``"worker crashed"``.
        """
        if self._workers is None:
            raise RuntimeError("RewardPool is closed")
        results: list[dict | None] = [None] * len(items)
        jobs = _jobs(items)
        pending = list(range(len(jobs)))[::-1]
        remaining = len(jobs)
        while remaining:
            for worker in self._workers:
                if worker.ready and worker.index is None and pending:
                    worker.index = pending.pop()
                    worker.deadline = time.monotonic() + self.timeout_s
                    worker.conn.send((worker.index, jobs[worker.index][1]))
            busy = [w.deadline for w in self._workers if w.index is not None]
            wait_s = max(0.0, min(busy) - time.monotonic()) if busy else 1.0
            ready_conns = wait([w.conn for w in self._workers], timeout=wait_s)
            for position, worker in enumerate(self._workers):
                if worker.conn in ready_conns:
                    try:
                        message = worker.conn.recv()
                    except (EOFError, OSError):
                        message = None
                    if message == _READY:
                        worker.ready = True
                        self._startup_failures = 0
                        continue
                    if message is None and not worker.ready:
                        self._startup_failures += 1
                        if self._startup_failures > 3:
                            raise RuntimeError("reward workers keep dying before they are ready; see their stderr")
                    if message is not None:
                        index, result = message
                        for position_in_job, item_index in enumerate(jobs[index][0]):
                            results[item_index] = result[position_in_job] if isinstance(result, list) else result
                        remaining -= 1
                        worker.index = None
                        continue
                    failed_index, error = worker.index, "worker crashed"
                elif worker.index is not None and time.monotonic() >= worker.deadline:
                    failed_index, error = worker.index, "timeout"
                else:
                    continue
                if failed_index is not None:
                    for item_index in jobs[failed_index][0]:
                        results[item_index] = _failed(error)
                    remaining -= 1
                logger.warning("reward worker %s (%s); replacing it", error, worker.process.pid)
                self._replace(position)
        self._report_yaml_failures(items, results)
        return results  # type: ignore[return-value]

    def _report_yaml_failures(self, items: list[dict], results: list[dict | None]) -> None:
        """One warning with the count of yaml_task responses scored 0 on an error, and the first errors."""
        from agent_system.rewards.yaml_reward import DATA_SOURCE

        yaml = [i for i, item in enumerate(items) if item.get("data_source") == DATA_SOURCE]
        failed = [results[i]["error"] for i in yaml if results[i] and results[i].get("error")]
        if failed:
            self.yaml_failures += len(failed)
            logger.warning(
                "yaml_task grading: %d of %d responses scored 0 on an error (%d so far); first: %s",
                len(failed),
                len(yaml),
                self.yaml_failures,
                " | ".join(str(e)[:300] for e in failed[:3]),
            )

    def close(self) -> None:
        """Stops the workers (idempotent)."""
        if self._workers is None:
            return
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=2)
            worker.kill()
        self._workers = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
