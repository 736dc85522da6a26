"""All-golds checks of the math grader: every gold answer against itself, and against every other gold.

* **Self check** (:func:`self_check`): each gold, written as a model writes a final answer (:func:`model_renderings`:
  boxed in a sentence, a brace-less ``\\boxed 6.``, thousands separators on numbers, ``\\dfrac`` for ``\\frac``), must
  score 1 through :func:`agent_system.rewards.compute_score` with its data source (``math500`` or ``gsm8k``).
* **Cross check** (:func:`cross_check`): no gold may score 1 against another problem's gold of the same data set when
  the two answers differ. Golds are deduplicated by their normalised string first (equal strings are the same
  answer); each remaining ordered pair gets exactly :func:`agent_system.rewards.math_reward.answers_match`'s verdict
  (string equality, then :func:`~agent_system.rewards.math_reward.parsed_match` on the parses, each parsed once).
  Matches are returned for review: a match is either a true equivalence written two ways, or a false positive.

The numbers in ``docs/GRADER.md`` come from::

    python -m agent_system.rewards.gold_sweep --data ../shared/data --workers 2
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from agent_system.rewards.math_answer import gsm8k_gold, normalize_answer
from agent_system.rewards.math_reward import parse_answer, parse_gold, parsed_match

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_TOKEN = re.compile(r"-?[\w.]+")


@dataclass(frozen=True)
class Gold:
    """One problem's gold answer: ``source`` is its compute_score data source (``math500``, ``gsm8k``)."""

    problem_id: str
    source: str
    answer: str


@dataclass
class SelfCheck:
    """Responses graded and the ones that did not score 1: ``(problem_id, gold, response)``."""

    graded: int = 0
    failures: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class CrossCheck:
    """Distinct golds per data set, ordered pairs graded, and the pairs that matched: ``(source, pred, gold)``."""

    distinct: dict[str, int] = field(default_factory=dict)
    pairs: int = 0
    matches: list[tuple[str, str, str]] = field(default_factory=list)
    slowest: list[tuple[float, str, str]] = field(default_factory=list)  # the ten slowest pairs (seconds, pred, gold)
    seconds: float = 0.0


def with_thousands(number: str) -> str:
    """``11111111100`` -> ``11,111,111,100`` (the decimals kept as they are)."""
    sign = "-" if number.startswith("-") else ""
    whole, dot, decimals = number.lstrip("-").partition(".")
    return f"{sign}{int(whole):,}{dot}{decimals}"


def model_renderings(gold: str) -> list[str]:
    """Responses whose final answer is ``gold``, in the forms models write it.

    ``The final answer is $\\boxed{G}$.`` always; for a number, the same without separators and with thousands
    separators (``1,234``); ``\\dfrac`` for ``\\frac``; ``so it is \\boxed G.`` (no braces, sentence period) for a
    single token such as ``6`` or ``-2.5``.
    """
    forms = {gold}
    # a number's digits, read here without the grader's normalisation (which is what is being checked)
    compact = re.sub(r"\\!|\s", "", gold).replace("{,}", ",")
    plain = compact.replace(",", "") if _THOUSANDS.fullmatch(compact) else compact
    if _NUMBER.fullmatch(plain):
        forms |= {plain, with_thousands(plain)}
    if "\\frac" in gold:
        forms.add(gold.replace("\\frac", "\\dfrac"))
    responses = [f"The final answer is $\\boxed{{{form}}}$." for form in sorted(forms)]
    if _TOKEN.fullmatch(plain):
        responses.append(f"so it is \\boxed {plain}.")
    return responses


def self_check(golds: list[Gold]) -> SelfCheck:
    """Every gold in every :func:`model_renderings` form through ``compute_score`` (rules only: no judge passed)."""
    from agent_system.rewards import compute_score

    result = SelfCheck()
    for gold in golds:
        for response in model_renderings(gold.answer):
            result.graded += 1
            if compute_score(gold.source, response, gold.answer)["score"] != 1.0:
                result.failures.append((gold.problem_id, gold.answer, response))
    return result


def _against_all(pred: str, golds: list[str], timeout_s: float) -> tuple[list[str], list[tuple[float, str]]]:
    """The golds (normalised, distinct from ``pred``) that ``pred`` matches, and each pair's seconds."""
    pred_parsed = parse_answer(pred, timeout_s)
    matched, seconds = [], []
    for gold in golds:
        if gold == pred:
            continue
        start = time.perf_counter()
        # answers_match(pred, gold) with the parse of pred done once: the normalised strings differ here
        if parsed_match(pred, gold, parse_gold(gold, timeout_s), pred_parsed, timeout_s):
            matched.append(gold)
        seconds.append((time.perf_counter() - start, gold))
    return matched, seconds


def cross_check(golds: list[Gold], workers: int = 1, timeout_s: float = 5.0) -> CrossCheck:
    """Every distinct gold of a data set against every other one of the same data set (both orders).

    Args:
        golds: The gold answers (several data sets may be mixed: pairs stay within a data set).
        workers: Processes (forked; each grades whole rows of the pair matrix in its main thread, where
            math-verify's timeouts work).
        timeout_s: math-verify timeouts per pair.
    """
    by_source: dict[str, list[str]] = {}
    for gold in golds:
        keys = by_source.setdefault(gold.source, [])
        norm = normalize_answer(gold.answer)
        if norm not in keys:
            keys.append(norm)
    result = CrossCheck(distinct={source: len(keys) for source, keys in by_source.items()})
    # the cheap data sets first (GSM8K: integers only), so their complete counts come early in the log
    order = sorted(by_source, key=lambda source: (source != "gsm8k", source))
    jobs = [(source, pred, by_source[source]) for source in order for pred in by_source[source]]
    start = time.perf_counter()
    slow: list[tuple[float, str, str]] = []
    with ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context("fork")) as pool:
        preds, keys = [pred for _, pred, _ in jobs], [keys for _, _, keys in jobs]
        if workers > 1:
            rows = pool.map(_against_all, preds, keys, [timeout_s] * len(jobs), chunksize=2)
        else:  # in this process (the pool starts no worker until work is submitted)
            rows = map(_against_all, preds, keys, [timeout_s] * len(jobs))
        for done, ((source, pred, keys), (matched, seconds)) in enumerate(zip(jobs, rows, strict=True), start=1):
            result.pairs += len(keys) - 1
            result.matches += [(source, pred, gold) for gold in matched]
            slow = sorted(slow + [(s, pred, gold) for s, gold in seconds], reverse=True)[:10]
            if done % 25 == 0 or done == len(jobs):
                logger.info(
                    "cross check: %d/%d golds (%s) done, %d pairs, %d matched, %.0f s",
                    done,
                    len(jobs),
                    source,
                    result.pairs,
                    len(result.matches),
                    time.perf_counter() - start,
                )
    result.slowest = slow
    result.seconds = time.perf_counter() - start
    return result


def load_golds(data: str | Path) -> list[Gold]:
    """MATH-500's 500 answers (``math500/test.jsonl``) and GSM8K's 1,319 test answers (``gsm8k/test.jsonl``)."""
    data = Path(data)
    golds = []
    with open(data / "math500" / "test.jsonl", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            golds.append(Gold(row["unique_id"], "math500", row["answer"]))
    with open(data / "gsm8k" / "test.jsonl", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            answer = gsm8k_gold(json.loads(line)["answer"])
            if answer is None:
                raise ValueError(f"{data / 'gsm8k' / 'test.jsonl'}:{number}: no '#### N' final answer")
            golds.append(Gold(f"gsm8k/test/{number}", "gsm8k", answer))
    return golds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data", help="folder with math500/ and gsm8k/ test.jsonl")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-cross", action="store_true", help="only the self check (about a second)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    golds = load_golds(args.data)
    start = time.perf_counter()
    own = self_check(golds)
    logger.info(
        "self check: %d golds, %d responses graded, %d not scored 1 (%.1f s)",
        len(golds),
        own.graded,
        len(own.failures),
        time.perf_counter() - start,
    )
    for failure in own.failures:
        logger.info("  self miss: %s", failure)
    if args.skip_cross:
        return
    cross = cross_check(golds, args.workers)
    logger.info(
        "cross check: distinct golds %s, %d ordered pairs, %d matched (%.0f s, %d workers)",
        cross.distinct,
        cross.pairs,
        len(cross.matches),
        cross.seconds,
        args.workers,
    )
    for match in cross.matches:
        logger.info("  match: %s", match)
    for seconds, pred, gold in cross.slowest:
        logger.info("  slow pair %.2f s: %r vs gold %r", seconds, pred, gold)


if __name__ == "__main__":
    main()
