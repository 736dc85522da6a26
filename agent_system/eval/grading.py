"""The evaluator's grading beyond the rule-based score: the outcome of each answer, the lenient column, the judge.

* :func:`outcome`: one of :data:`OUTCOMES` per graded answer, from the grader's result and the turn's truncation:
  ``timeout`` (the grader overran its wall-clock limit), ``error`` (the grader failed: a crashed worker, an
  exception), ``correct``, ``truncated`` (not correct, and the turn used its whole token budget), ``no_answer``
  (no final answer found by the strict extraction), ``wrong`` (an answer was found and is not equivalent), in
  this order of precedence.
* :class:`LenientGrader`: math-verify's *default* extraction (``math_verify.parse`` on the whole response: LaTeX and
  plain expressions, an unboxed final answer counts), verified against the same gold; the column papers that use
  math-verify's defaults report. Runs in killable worker processes, like
  :class:`agent_system.rewards.RewardPool`: a response is hostile input, and a stuck parse must not stall the run.
* :func:`judge_answers`: the LLM judge named by the evaluator's arguments, asked about every answer the rules found
  wrong (an answer was extracted), with the problem text; its verdicts are a column of their own.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)

OUTCOMES = ("correct", "wrong", "no_answer", "truncated", "timeout", "error")
# the rule-based grader's messages (agent_system.rewards): no answer, and answers graded as wrong
NO_ANSWER = "no answer found"
GRADED_WRONG = (None, "answer too long")
TIMEOUT = "timeout"
# judge verdicts per answer: not asked (rule-correct, or no answer), yes, no, failed (the rule verdict stands)
JUDGE_VERDICTS = ("not_asked", "yes", "no", "failed")


def outcome(result: dict, truncated: bool) -> str:
    """The outcome of one answer from its ``RewardPool`` result (``acc``, ``error``) and its turn's truncation."""
    error = result.get("error")
    if error == TIMEOUT:
        return "timeout"
    if error not in GRADED_WRONG and error != NO_ANSWER:
        return "error"
    if result["acc"]:
        return "correct"
    if truncated:
        return "truncated"
    return "no_answer" if error == NO_ANSWER else "wrong"


def lenient_grade(response: str, gold: str, timeout_s: float) -> dict:
    """math-verify's default extraction of ``response``, verified against ``gold`` (a bare answer).

    Returns:
        ``{"lenient": bool, "lenient_answer": str}``; the answer is math-verify's extracted string ("" if none).
    """
    from math_verify import parse, verify

    from agent_system.rewards.math_reward import parse_gold

    seconds = max(1, round(timeout_s))
    parsed = parse(response or "", parsing_timeout=seconds)
    gold_parsed = list(parse_gold(gold, timeout_s))
    answer = str(parsed[-1])[:200] if parsed else ""
    ok = bool(parsed and gold_parsed and verify(gold_parsed, parsed, timeout_seconds=seconds))
    return {"lenient": ok, "lenient_answer": answer}


def _worker(conn: Connection, timeout_s: float) -> None:
    """Receive ``(index, response, gold)``, send back ``(index, result)``; ``None`` stops the worker."""
    inner_s = max(1.0, timeout_s / 3)
    lenient_grade("\\boxed{1}", "1", inner_s)  # imports and first parse before any pair's clock starts
    conn.send("ready")
    while (message := conn.recv()) is not None:
        index, response, gold = message
        try:
            result = {**lenient_grade(response, gold, inner_s), "lenient_error": None}
        except Exception as exc:  # a hostile response must not take the worker down
            result = {"lenient": False, "lenient_answer": "", "lenient_error": f"{type(exc).__name__}: {exc}"[:300]}
        conn.send((index, result))


class LenientGrader:
    """Grades ``(response, gold)`` pairs with :func:`lenient_grade` in ``workers`` spawned processes; a worker that
    overruns ``timeout_s`` on one pair is killed and replaced, and the pair counts as not correct with
    ``lenient_error`` ``"timeout"``."""

    def __init__(self, workers: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers = [self._start() for _ in range(workers)]

    def _start(self) -> dict:
        conn, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker, args=(child, self.timeout_s), daemon=True)
        process.start()
        child.close()
        conn.recv()  # "ready": the imports are not part of any pair's time
        return {"conn": conn, "process": process, "index": None, "deadline": 0.0}

    def _replace(self, position: int) -> None:
        worker = self._workers[position]
        worker["process"].kill()
        worker["process"].join(timeout=5)
        worker["conn"].close()
        self._workers[position] = self._start()

    def grade(self, pairs: list[tuple[str, str]]) -> list[dict]:
        results: list[dict | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))[::-1]
        while pending or any(w["index"] is not None for w in self._workers):
            for worker in self._workers:
                if worker["index"] is None and pending:
                    worker["index"] = pending.pop()
                    worker["deadline"] = time.monotonic() + self.timeout_s
                    worker["conn"].send((worker["index"], *pairs[worker["index"]]))
            deadline = min(w["deadline"] for w in self._workers if w["index"] is not None)
            ready = wait([w["conn"] for w in self._workers], timeout=max(0.0, deadline - time.monotonic()))
            for position, worker in enumerate(self._workers):
                if worker["index"] is None:
                    continue
                if worker["conn"] in ready:
                    try:
                        index, result = worker["conn"].recv()
                    except (EOFError, OSError):
                        index, result = worker["index"], {"lenient_error": "worker crashed"}
                        self._replace(position)
                    results[index] = result
                elif time.monotonic() >= worker["deadline"]:
                    logger.warning("lenient grading overran %.1f s; replacing its worker", self.timeout_s)
                    results[worker["index"]] = {"lenient_error": "timeout"}
                    self._replace(position)
                else:
                    continue
                self._workers[position]["index"] = None
        return [{"lenient": False, "lenient_answer": "", **r} for r in results]  # type: ignore[dict-item]

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker["conn"].send(None)
            except (OSError, ValueError):
                pass
            worker["process"].join(timeout=2)
            if worker["process"].is_alive():
                worker["process"].kill()
                worker["process"].join(timeout=5)
            worker["conn"].close()
        self._workers = []

    def __enter__(self) -> LenientGrader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def judge_answers(questions: list[tuple[str, str, str]], config, threads: int = 8) -> list[str]:
    """Asks the judge about each ``(problem, gold, answer)``; one of ``yes``, ``no``, ``failed`` per question."""
    from agent_system.rewards.judge import judge_equivalence

    def ask(question: tuple[str, str, str]) -> str:
        verdict = judge_equivalence(*question, config)
        return "failed" if verdict is None else "yes" if verdict else "no"

    if not questions:
        return []
    with ThreadPoolExecutor(max_workers=threads) as executor:
        return list(executor.map(ask, questions))
