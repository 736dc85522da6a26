"""RewardPool: score batches in worker processes with a wall-clock limit per item enforced from outside.

Each worker is a ``spawn``-ed process (safe to create from a threaded process such as a Ray actor) that
runs :func:`agent_system.rewards.scoring.compute_score` in its main thread, so math-verify's SIGALRM
timeouts work and gold parses are cached per worker. The parent hands one item at a time to an idle
worker; a worker that overruns the limit is killed and replaced, and its item scores 0 with error
``"timeout"``. A worker that dies (e.g. a segfault in a C extension) is replaced the same way.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)

_READY = "ready"


def _worker_main(conn: Connection, timeout_s: float, judge) -> None:
    """Worker loop: receive ``(index, item)``, send back ``(index, result)``; ``None`` means stop."""
    from agent_system.rewards.code_sandbox import SandboxLimits
    from agent_system.rewards.scoring import compute_score

    # keep math-verify's own timeouts and the sandbox inside the parent's wall-clock limit
    inner_s = max(1.0, timeout_s / 3)
    limits = SandboxLimits.within(timeout_s)
    conn.send(_READY)
    while True:
        message = conn.recv()
        if message is None:
            return
        index, item = message
        try:
            result = compute_score(
                item["data_source"],
                item["solution_str"],
                item["ground_truth"],
                item.get("extra_info"),
                timeout_s=inner_s,
                judge=judge,
                sandbox_limits=limits,
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


def _failed(error: str) -> dict:
    return {"score": 0.0, "acc": False, "pred": "", "error": error}


class _Worker:
    """One worker process with its pipe and the item it is busy with."""

    def __init__(self, ctx, timeout_s: float, judge) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child_conn, timeout_s, judge), daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False
        self.index: int | None = None
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
        start_method: ``"spawn"`` (default) or ``"forkserver"``; never ``fork`` (unsafe in threaded parents).

    Example:
        >>> with RewardPool(num_workers=2, timeout_s=10) as pool:
        ...     results = pool.score([{"data_source": "arith", "solution_str": "\\\\boxed{12}",
        ...                            "ground_truth": "12", "extra_info": None}])
    """

    def __init__(self, num_workers: int, timeout_s: float, judge=None, start_method: str = "spawn") -> None:
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError("num_workers must be >= 1 and timeout_s > 0")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError("start_method must be 'spawn' or 'forkserver'")
        self.timeout_s = float(timeout_s)
        self._judge = judge
        self._ctx = mp.get_context(start_method)
        self._workers = [_Worker(self._ctx, self.timeout_s, judge) for _ in range(num_workers)]
        self.num_restarts = 0
        self._startup_failures = 0

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _replace(self, position: int) -> None:
        self._workers[position].kill()
        self._workers[position] = _Worker(self._ctx, self.timeout_s, self._judge)
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
        pending = list(range(len(items)))[::-1]
        remaining = len(items)
        while remaining:
            for worker in self._workers:
                if worker.ready and worker.index is None and pending:
                    worker.index = pending.pop()
                    worker.deadline = time.monotonic() + self.timeout_s
                    worker.conn.send((worker.index, items[worker.index]))
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
                        results[index] = result
                        remaining -= 1
                        worker.index = None
                        continue
                    failed_index, error = worker.index, "worker crashed"
                elif worker.index is not None and time.monotonic() >= worker.deadline:
                    failed_index, error = worker.index, "timeout"
                else:
                    continue
                if failed_index is not None:
                    results[failed_index] = _failed(error)
                    remaining -= 1
                logger.warning("reward worker %s (%s); replacing it", error, worker.process.pid)
                self._replace(position)
        return results  # type: ignore[return-value]

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
