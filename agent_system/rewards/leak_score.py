"""Score the leak check on labelled feedbacks (docs/LEAK.md, "Auditing the check on your own feedbacks").

    python -m agent_system.rewards.leak --score FILE.jsonl [--workers N] [--timeout-s S]
        [--reader MODEL [--reader-threshold NATS]]

Each line of ``FILE.jsonl`` is one JSON object: ``problem`` (the problem text: the rules read what it asks, value
presence what it writes), ``ground_truth`` (the gold answer as the dataset gives it), ``feedback`` and ``leak``
(true / false or 1 / 0: whether the feedback gives the answer away); ``attempt`` (the solver's answer the feedback
replies to) is optional, read and not used by the check. Empty lines are skipped. Each feedback is checked as the
trainer checks a math row's (:func:`agent_system.rewards.leak.check_labelled`: the rules and value presence, the
candidates graded by a :class:`~agent_system.rewards.RewardPool`), and the command prints every disagreement, the
recall, the false positives and a last line ``leak score: C/N right, FP false positives, FN misses``.

``--reader MODEL`` adds the reader test (:mod:`agent_system.rewards.leak_reader`, docs/LEAK.md "The reader test") as
the trainer joins it: a Hugging Face causal LM (a folder or a hub name in the local cache), run on the CPU, scores
the gold as the immediate answer after the refine prompt (the math templates, the line's ``attempt`` or an empty one)
with the feedback and with a neutral one; a feedback whose gain reaches ``--reader-threshold`` nats leaks too. The
report then gives each feedback's gain among the disagreements and a line with the reader's count.

A file it cannot read stops it with one line naming the file (and the line and field) on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent_system.rewards.leak_reader import DEFAULT_THRESHOLD_NATS, hf_gains, reader_rows, reader_verdicts

FIELDS = ("problem", "ground_truth", "feedback", "leak")
SHOWN_CHARS = 160  # of a disagreeing feedback
DEFAULT_WORKERS, DEFAULT_TIMEOUT_S = 2, 5.0  # the timeout: mlmt.reward.timeout_s's default
READER_PROMPT_TOKENS = 4096  # the reader's prompt budget: data.max_prompt_length's default


class LabelledFileError(ValueError):
    """A labelled file the command cannot read; the message names the file, and the line and field where it can."""


@dataclass
class Disagreement:
    line: int  # 1-based line of the file
    item: dict
    missed: bool  # a labelled leak not flagged (else a near miss flagged)


@dataclass
class LabelledScore:
    """The check's verdicts against the labels."""

    total: int
    leaks: int  # labelled leaks
    caught: int  # of them, flagged
    false_positives: int  # labelled near misses flagged
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.leaks - self.caught

    @property
    def right(self) -> int:
        return self.total - self.misses - self.false_positives


def _kind(value) -> str:
    return {bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _checked(item, where: str) -> dict:
    """One line's object with its fields checked; ``ground_truth`` as a string, ``leak`` as a bool."""
    if not isinstance(item, dict):
        raise LabelledFileError(f"{where}: a line must be one JSON object with {', '.join(FIELDS)} (got {_kind(item)})")
    missing = [name for name in FIELDS if name not in item]
    if missing:
        raise LabelledFileError(f"{where}: missing field {', '.join(repr(name) for name in missing)}")
    for name in ("problem", "feedback", *(["attempt"] if "attempt" in item else [])):
        if not isinstance(item[name], str):
            raise LabelledFileError(f"{where}: field {name!r} must be a string (got {_kind(item[name])})")
    gold = item["ground_truth"]
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)) or not str(gold).strip():
        raise LabelledFileError(f"{where}: field 'ground_truth' must be a non-empty string or number")
    label = item["leak"]
    if not (isinstance(label, bool) or (isinstance(label, int) and label in (0, 1))):
        raise LabelledFileError(f"{where}: field 'leak' must be true / false or 1 / 0 (got {json.dumps(label)})")
    return {**item, "ground_truth": str(gold), "leak": bool(label)}


def read_labelled(path: str | Path) -> list[tuple[int, dict]]:
    """``(line number, item)`` per non-empty line of a labelled JSONL file.

    Raises:
        LabelledFileError: The file does not exist or is not UTF-8 text; a line is not JSON, not an object, lacks a
            field or has one of the wrong type; or no line holds an item. The message names the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise LabelledFileError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise LabelledFileError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise LabelledFileError(f"{path} line {number}: invalid JSON ({error.msg}, column {error.colno})") from None
        items.append((number, _checked(item, f"{path} line {number}")))
    if not items:
        raise LabelledFileError(f"{path}: no labelled feedbacks (every line is empty)")
    return items


def score_labelled(lines: Sequence[tuple[int, dict]], verdicts: np.ndarray) -> LabelledScore:
    """The verdicts (1.0 leak, 0.0 not) against the items' ``leak`` labels."""
    score = LabelledScore(total=len(lines), leaks=0, caught=0, false_positives=0)
    for (number, item), verdict in zip(lines, verdicts, strict=True):
        flagged = verdict == 1.0
        score.leaks += item["leak"]
        score.caught += item["leak"] and flagged
        score.false_positives += flagged and not item["leak"]
        if flagged != item["leak"]:
            score.disagreements.append(Disagreement(number, item, missed=item["leak"]))
    return score


def _shown(text: str) -> str:
    shown = json.dumps(text[:SHOWN_CHARS], ensure_ascii=False)
    return shown + (f" (+{len(text) - SHOWN_CHARS} characters)" if len(text) > SHOWN_CHARS else "")


def _share(part: int, whole: int) -> str:
    return f" ({100 * part / whole:.1f} %)" if whole else ""


def report(score: LabelledScore, path: str | Path) -> list[str]:
    """The printed report: the disagreements, recall, false positives and the last ``leak score:`` line."""
    near_misses = score.total - score.leaks
    lines = [f"{path}: {score.total} labelled feedbacks ({score.leaks} leaks, {near_misses} near misses)"]
    if score.disagreements:
        lines.append("disagreements:")
    for item in score.disagreements:
        what = "missed leak" if item.missed else "false positive"
        gain = f", reader gain {item.item['reader_gain']:.2f}" if "reader_gain" in item.item else ""
        lines.append(
            f"  line {item.line}: {what} (gold {item.item['ground_truth']}{gain}): {_shown(item.item['feedback'])}"
        )
    lines += [
        f"recall: {score.caught}/{score.leaks} leaks caught{_share(score.caught, score.leaks)}"
        if score.leaks
        else "recall: no leak is labelled",
        f"false positives: {score.false_positives}/{near_misses} near misses flagged"
        f"{_share(score.false_positives, near_misses)}",
        f"leak score: {score.right}/{score.total} right, {score.false_positives} false positives, "
        f"{score.misses} misses",
    ]
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        self.exit(2, f"{self.prog}: {message} (--help lists the options)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m agent_system.rewards.leak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--score", metavar="FILE.jsonl", required=True, help="labelled feedbacks, one JSON a line")
    parser.add_argument("--reader", metavar="MODEL", help="a causal LM for the reader test (the solver's model)")
    parser.add_argument(
        "--reader-threshold",
        type=float,
        default=DEFAULT_THRESHOLD_NATS,
        metavar="NATS",
        help="gain at which the reader flags a leak (mlmt.reward.leak_reader_threshold's default)",
    )
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="grading worker processes")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="wall-clock limit per candidate")
    return parser


def main(argv: Sequence[str] | None, pool, check_labelled) -> int:
    """The command (run as :func:`agent_system.rewards.leak.main`, which passes its ``check_labelled``: this module
    does not import the check); returns its exit status (0, or 2 for input it refuses). ``pool``: a RewardPool to
    grade with (tests); None: one of ``--workers`` processes is started after the file is read and closed at the end."""
    from agent_system.rewards import RewardPool

    parser = _parser()
    args = parser.parse_args(argv)
    if args.workers < 1 or not args.timeout_s > 0:
        parser.error(f"--workers {args.workers} --timeout-s {args.timeout_s}: need at least 1 worker and a time > 0")
    if not args.reader_threshold > 0:
        parser.error(f"--reader-threshold {args.reader_threshold}: a gain in nats, must be > 0")
    try:
        lines = read_labelled(args.score)
        reader = None if args.reader is None else _load_reader(args.reader)  # before any worker starts
    except LabelledFileError as error:
        sys.stderr.write(f"{parser.prog}: {error}\n")
        return 2
    items = [item for _, item in lines]
    if pool is None:
        with RewardPool(args.workers, args.timeout_s) as own_pool:
            verdicts = check_labelled(own_pool, items)
    else:
        verdicts = check_labelled(pool, items)
    extra = []
    if reader is not None:
        gains = _gains(reader, items)
        flagged = reader_verdicts(gains, args.reader_threshold)
        verdicts = np.fmax(verdicts, flagged)
        extra = [
            f"reader {args.reader}: {int(flagged.sum())}/{len(items)} feedbacks with a gain >= "
            f"{args.reader_threshold:g} nats (mean gain {float(np.mean(gains)):.2f} nats)"
        ]
        for item, gain in zip(items, gains, strict=True):
            item["reader_gain"] = float(gain)
    page = report(score_labelled(lines, verdicts), args.score)
    sys.stdout.write("\n".join([*page[:-3], *extra, *page[-3:]]) + "\n")
    return 0


def _load_reader(name: str):
    """(tokenizer, model) of ``--reader``, on the CPU in float32; a model it cannot load is a LabelledFileError."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LabelledFileError(f"--reader {name}: cannot load a causal language model ({first})") from None
    return tokenizer, model


def _gains(reader, items: list[dict]) -> np.ndarray:
    """The reader's gain of each item's feedback (the math templates, the item's attempt or an empty one)."""
    from agent_system.prompts.templates import PromptBuilder, Task

    tokenizer, model = reader
    prompts = PromptBuilder()
    rows = [
        reader_rows(
            prompts,
            Task(item["problem"], "math", item["ground_truth"]),
            item.get("attempt", ""),
            item["feedback"],
            item["ground_truth"],
            tokenizer,
            READER_PROMPT_TOKENS,
        )
        for item in items
    ]
    return hf_gains(model, rows)
