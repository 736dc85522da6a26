"""Feedback leaks: does a feedback (the HL's turn 2) state the problem's answer?

The HL must guide the solver without solving for it. A feedback *leaks* when one of its candidate answers is the
ground truth under the grader's own equivalence: each candidate is graded as the answer ``\\boxed{candidate}`` by
:class:`agent_system.rewards.RewardPool` (math-verify, in killable worker processes with the pool's wall-clock limit
per candidate, rules only: never the LLM judge). A feedback is hostile input: only its first and last
:data:`SCAN_CHARS` characters are read, at most :data:`MAX_CANDIDATES` candidates of at most
:data:`MAX_CANDIDATE_CHARS` characters each are graded, and box matching looks at most that far.

Candidates (nothing else counts):

1. the content of every complete ``\\boxed{...}`` / ``\\fbox{...}`` (a box states a final answer);
2. a statement of *the* answer: "the (final / correct / right) answer is X", "... should be X", "final answer: X",
   "Answer: X"; not when negated ("the answer is not 5", "isn't"), quoting the solver ("your answer is 5", "you
   said the answer is 5"), conditional ("if the answer is 5"), a question, or followed by "which is wrong";
3. the right side of an ``= X`` that ends the feedback (only closing punctuation after X);
4. the last number of the feedback when it ends the text, in a last sentence with no negation, no question mark,
   and not a reference ("step 2", "equation (3)").

Numbers in the working (``3 · 4 = 12``, then more text) are intermediate values and are never candidates.

Code (mbpp) and YAML-defined tasks: **not applicable**. Their HL writes about an execution result, and "the
answer" is a program that passes hidden tests; no equivalence grader exists for a program written inside prose, so
their feedbacks are not checked and not counted (the metrics cover math rows only; ``leak_checked`` says how many).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

from agent_system.rewards.scoring import task_kind

logger = logging.getLogger(__name__)

SCAN_CHARS = 8_000  # read this many characters from each end of a feedback
MAX_CANDIDATES = 8  # graded candidates per feedback (boxes first, then statements, then the ending)
MAX_CANDIDATE_CHARS = 200
MAX_BOXES = 16  # boxes examined per feedback (the last ones)
TRANSITIONS = ("i2c", "i2i", "c2c", "c2i")  # turn-1 outcome → turn-3 outcome (i: incorrect, c: correct)

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_STATEMENT_RE = re.compile(
    r"(?:\b(?:the\s+)?(?:final|correct|right|true|actual|expected)\s+answer|\bthe\s+answer|^\W*answer)"
    r"\s*(?:is|should\s+be|would\s+be|will\s+be|must\s+be|equals|=|:)",
    re.IGNORECASE | re.MULTILINE,
)
_DIRECT_NEGATION_RE = re.compile(r"^(?:n't|\s*not\b|\s*never\b)", re.IGNORECASE)
_QUOTING_RE = re.compile(
    r"\b(?:your|you|you've|you're|if|whether|suppose|assume|assuming|claims?|claimed|thought|think)\W+"
    r"(?:\w+\W+){0,4}$",
    re.IGNORECASE,
)
_WRONG_RE = re.compile(r"\b(?:wrong|incorrect|not\s+correct|not\s+right|mistaken|a\s+mistake|an\s+error)\b", re.I)
_NEGATION_RE = re.compile(
    r"n't\b|\b(?:not|never|no|wrong|incorrect|mistake|mistaken|error|instead|rather|than)\b", re.IGNORECASE
)
_REFERENCE_RE = re.compile(
    r"\b(?:step|steps|line|lines|equation|eq|part|case|row|item|stage|paragraph|problem|question|turn)\W*$",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_TRAILER_RE = re.compile(r"^[\s$.!*)\]}]*$")  # what may follow an answer that ends the text
_DOLLAR_RE = re.compile(rf"^\$+((?:\\.|[^$\\]){{1,{MAX_CANDIDATE_CHARS}}})\$")
_PROSE_RE = re.compile(r"\s+[A-Za-z]{2,}\b")  # a value ends before a word


def scanned_text(feedback: str) -> str:
    """The part of a feedback that is read: all of it, or its first and last :data:`SCAN_CHARS` characters."""
    if len(feedback) <= 2 * SCAN_CHARS:
        return feedback
    return feedback[:SCAN_CHARS] + "\n" + feedback[-SCAN_CHARS:]


def _boxes(text: str) -> list[str]:
    """Contents of the last :data:`MAX_BOXES` complete boxes, each matched within :data:`MAX_CANDIDATE_CHARS`."""
    found = []
    for match in list(_BOX_RE.finditer(text))[-MAX_BOXES:]:
        depth, start = 0, match.end() - 1
        for i in range(start, min(len(text), start + MAX_CANDIDATE_CHARS + 2)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start + 1 : i])
                break
    return found


def _value(rest: str) -> str:
    """The maths at the start of ``rest``: ``$...$``, ``\\(...\\)``, else the text before prose or punctuation
    outside brackets (a comma, semicolon or stop followed by a space, a line break, a word of two letters or more)."""
    rest = rest.strip().replace("**", "").lstrip()
    dollars = _DOLLAR_RE.match(rest)
    if dollars:
        return dollars.group(1).strip()
    if rest.startswith("\\(") and "\\)" in rest[:MAX_CANDIDATE_CHARS]:
        return rest[2 : rest.index("\\)")].strip()
    depth, end = 0, min(len(rest), MAX_CANDIDATE_CHARS + 1)
    for i, char in enumerate(rest[:end]):
        depth += (char in "([{") - (char in ")]}")
        if depth > 0:
            continue
        following = rest[i + 1 : i + 2]
        if char == "\n" or (char in ",;." and following in ("", " ", "\n")) or _PROSE_RE.match(rest, i):
            end = i
            break
    return rest[:end].strip().rstrip(".,;:!?").strip().strip("$").strip()


def _statements(sentence: str) -> list[str]:
    """Rule 2: the values "the answer is X" states in one sentence, unless negated, quoted or conditional."""
    values = []
    for match in _STATEMENT_RE.finditer(sentence):
        rest = sentence[match.end() :]
        before = sentence[max(0, match.start() - 60) : match.start()]
        if _DIRECT_NEGATION_RE.match(rest) or _QUOTING_RE.search(before) or sentence.rstrip().endswith("?"):
            continue
        value = _value(rest)
        after = rest.split(value, 1)[-1] if value else rest
        if value and not _WRONG_RE.search(after[:80]):
            values.append(value)
    return values


def _ending(sentence: str) -> list[str]:
    """Rules 3 and 4: an ``= X`` or a number that ends the last sentence of the feedback."""
    values = []
    equals = [m for m in re.finditer(r"(?<![!<>=\\])=(?!=)", sentence)]
    if equals:
        rest = sentence[equals[-1].end() :]
        value = _value(rest)
        if value and _TRAILER_RE.match(rest.split(value, 1)[-1]):
            values.append(value)
    numbers = list(_NUMBER_RE.finditer(sentence))
    if numbers:
        last = numbers[-1]
        clean = not _NEGATION_RE.search(sentence) and "?" not in sentence
        head = sentence[: last.start()]
        in_latex = head[-1:] in ("{", "^", "_", "/", ".", "\\")  # the 2 of \\frac{1}{2}, x^2, 1.5
        plain = not in_latex and head.count("(") <= head.count(")")  # nor the last member of a tuple
        reference = _REFERENCE_RE.search(head)
        if clean and plain and not reference and _TRAILER_RE.match(sentence[last.end() :]):
            values.append(last.group().rstrip(","))
    return values


def candidate_answers(feedback: str) -> list[str]:
    """The candidate answers of a feedback (the module docstring's rules 1 to 4), distinct, at most
    :data:`MAX_CANDIDATES`, each with balanced braces and at most :data:`MAX_CANDIDATE_CHARS` characters."""
    text = scanned_text(feedback or "")
    sentences = [s for s in _SENTENCE_END_RE.split(text) if s.strip()]
    found = _boxes(text)
    for sentence in sentences:
        found += _statements(sentence)
    if sentences:
        found += _ending(sentences[-1])
    distinct: list[str] = []
    for value in (v.strip() for v in found):
        balanced = value.count("{") == value.count("}")
        if value and balanced and len(value) <= MAX_CANDIDATE_CHARS and value not in distinct:
            distinct.append(value)
    return distinct[:MAX_CANDIDATES]


def applies_to(data_source: str) -> bool:
    """Whether the leak check applies to a data source's feedbacks (math tasks; not code or YAML tasks)."""
    return task_kind(data_source) == "math"


def check_feedbacks(pool, feedbacks: Sequence[tuple[str, dict]]) -> np.ndarray:
    """Whether each feedback states its problem's answer, graded in one ``pool.score`` call.

    Args:
        pool: A :class:`agent_system.rewards.RewardPool` (or anything with its ``score``).
        feedbacks: ``(feedback text, dataset row)`` pairs; the row gives ``data_source`` and
            ``reward_model.ground_truth`` (verl parquet schema).

    Returns:
        (N,) float: 1.0 leaks, 0.0 does not, NaN not applicable (code and YAML tasks). A candidate whose grading
        timed out or crashed counts as not stating the answer (a warning gives the count).
    """
    result = np.full(len(feedbacks), np.nan)
    items, owners = [], []
    for index, (text, row) in enumerate(feedbacks):
        if not applies_to(row["data_source"]):
            continue
        result[index] = 0.0
        for candidate in candidate_answers(text):
            owners.append(index)
            items.append(
                {
                    "data_source": row["data_source"],
                    "solution_str": "\\boxed{" + candidate + "}",
                    "ground_truth": row["reward_model"]["ground_truth"],
                    "extra_info": {},
                    "rules_only": True,  # the pool never asks the LLM judge about a leak candidate
                }
            )
    if not items:
        return result
    graded = pool.score(items)
    failed = sum(r.get("error") in ("timeout", "worker crashed") for r in graded)
    if failed:
        logger.warning(
            "leak check: %d of %d candidate answers could not be graded (counted as no leak)", failed, len(items)
        )
    for owner, graded_item in zip(owners, graded, strict=True):
        if graded_item["acc"]:
            result[owner] = 1.0
    return result


def leak_scores(problems: Sequence[dict], episodes, pool) -> dict[str, np.ndarray]:
    """``{"leak": (B, n, m)}`` for a batch whose refinements follow HL feedbacks, else ``{}`` (no feedback turn).

    Args:
        problems: The B dataset rows.
        episodes: Their :class:`agent_system.multi_turn_rollout.episode.Episode` s (n attempts, m refinements each).
        pool: The reward pool the batch is graded with.
    """
    shape = (len(episodes), len(episodes[0].attempts), len(episodes[0].attempts[0].refinements))
    pairs = [
        (refinement.feedback.text if refinement.feedback is not None else None, row)
        for row, episode in zip(problems, episodes, strict=True)
        for attempt in episode.attempts
        for refinement in attempt.refinements
    ]
    if not pairs or any(text is None for text, _ in pairs):
        return {}
    return {"leak": check_feedbacks(pool, pairs).reshape(shape)}


def transition_names(first: np.ndarray, final: np.ndarray) -> np.ndarray:
    """``i2c`` / ``i2i`` / ``c2c`` / ``c2i`` per pair from boolean turn-1 and final correctness."""
    first, final = np.asarray(first, dtype=bool), np.asarray(final, dtype=bool)
    return np.where(first, np.where(final, "c2c", "c2i"), np.where(final, "i2c", "i2i"))


def leak_rates(leak: np.ndarray, first: np.ndarray, final: np.ndarray) -> dict[str, float]:
    """``leak_rate`` (share of checked feedbacks that leak), ``leak_checked`` (their number) and ``leak_rate_<t>``
    among the feedbacks of each turn transition ``t`` (absent when no checked feedback had that transition).

    Args:
        leak: Per feedback, 1.0 / 0.0 / NaN (not applicable), any shape.
        first: Turn-1 correctness of the attempt each feedback answers (same shape).
        final: Correctness of the refinement that followed the feedback (same shape).
    """
    leak = np.asarray(leak, dtype=np.float64).ravel()
    checked = ~np.isnan(leak)
    metrics = {"leak_checked": float(checked.sum())}
    if not checked.any():
        return metrics
    metrics["leak_rate"] = float(leak[checked].mean())
    names = transition_names(np.ravel(first), np.ravel(final))
    for name in TRANSITIONS:
        rows = checked & (names == name)
        if rows.any():
            metrics[f"leak_rate_{name}"] = float(leak[rows].mean())
    return metrics


def episode_leak_metrics(scores: dict[str, np.ndarray]) -> dict[str, float]:
    """:func:`leak_rates` of a training or validation batch's ``scores`` (``leak``, ``r1``, ``r3``), or {}."""
    if "leak" not in scores:
        return {}
    r3 = scores["r3"]
    first = np.repeat(scores["r1"][:, :, None], r3.shape[2], axis=2) > 0.5
    return leak_rates(scores["leak"], first, r3 > 0.5)


def record_leak_metrics(records: Sequence[dict], prefix: str) -> dict[str, float]:
    """:func:`leak_rates` over trajectory records (``agent_system.trainer.metrics.trajectory_records``: ``leak``,
    ``R1``, ``R3``), with ``prefix/`` on every name; {} when no record was checked. Validation pools its batches
    with it: a rate among one transition's feedbacks is not the mean of the batches' rates."""
    checked = [r for r in records if "leak" in r and "R3" in r]
    if not checked:
        return {}
    leaks = np.array([float(r["leak"]) for r in checked])
    first = np.array([r["R1"] > 0.5 for r in checked])
    final = np.array([r["R3"] > 0.5 for r in checked])
    return {f"{prefix}/{k}": v for k, v in leak_rates(leaks, first, final).items()}


def hl_leak_penalty(
    scores: dict[str, np.ndarray], rows: dict[str, list], penalty: float, hl_extra: np.ndarray | None
) -> np.ndarray | None:
    """The HL's extra score per row with ``mlmt.reward.leak_penalty``: ``hl_extra − penalty`` on the rows whose
    feedback leaks, unchanged elsewhere (``hl_extra`` as is when the penalty is 0 or nothing was checked).

    Args:
        scores: The batch's scores with ``leak`` (B, n, m).
        rows: The HL rows' ``problem``, ``attempt`` and ``feedback`` indices.
        penalty: ``mlmt.reward.leak_penalty`` (>= 0).
        hl_extra: (N,) extra HL scores so far (the confidence term), or None.
    """
    if penalty <= 0 or "leak" not in scores:
        return hl_extra
    leak = scores["leak"][np.asarray(rows["problem"]), np.asarray(rows["attempt"]), np.asarray(rows["feedback"])]
    terms = -penalty * np.nan_to_num(leak, nan=0.0)
    return terms if hl_extra is None else hl_extra + terms
