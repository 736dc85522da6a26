"""Score the leak check on labelled feedbacks (docs/LEAK.md, "Auditing the check on your own feedbacks").

    python -m agent_system.rewards.leak --score FILE.jsonl [--workers N] [--timeout-s S]
        [--reader MODEL [--reader-threshold NATS]]
        [--judge-model NAME --judge-base-url URL [--judge-timeout-s S] [--judge-api-key-env VAR]]

Each line of ``FILE.jsonl`` is one JSON object: ``problem`` (the problem text: the rules read what it asks, value
presence what it writes), ``ground_truth`` (the gold answer as the dataset gives it), ``feedback`` and ``leak``
(true / false or 1 / 0: whether the feedback gives the answer away); ``attempt`` (the solver's turn or bare answer
the feedback replies to) is optional: value presence applies the operations a feedback names to its answer
(:func:`agent_system.rewards.leak.attempt_answer`). Empty lines are skipped. Each feedback is checked as the
trainer checks a math row's (:func:`agent_system.rewards.leak.check_labelled`: the rules and value presence, the
candidates graded by a :class:`~agent_system.rewards.RewardPool`), and the command prints every disagreement, the
recall, the false positives and a last line ``leak score: C/N right, FP false positives, FN misses``.

``--reader MODEL`` adds the reader test (:mod:`agent_system.rewards.leak_reader`, docs/LEAK.md "The reader test") as
the trainer joins it: a Hugging Face causal LM (a folder or a hub name in the local cache), run on the CPU, scores
the gold as the immediate answer after the refine prompt (the math templates, the line's ``attempt`` or an empty one)
with the feedback and with a neutral one; a feedback whose gain reaches ``--reader-threshold`` nats leaks too. The
report then gives each feedback's gain among the disagreements and a line with the reader's count.

``--judge-model`` / ``--judge-base-url`` add the leak judge (:mod:`agent_system.rewards.judge`, docs/LEAK.md "The
leak judge", the trainer's ``mlmt.reward.leak_judge``): each feedback is asked of it, its verdicts joined to the
rules' as the trainer joins them (:func:`agent_system.rewards.leak.judged_verdicts`: its YES adds a leak, its NO
clears none, the rules stand where it fails), the API key read from the variable ``--judge-api-key-env`` names
(``MLMT_JUDGE_API_KEY`` by default). The report then gives a line with the judge's counts and, on each disagreement,
which checks flagged it and what the judge said. With the reader too, the three join as in the trainer; the last line
is always the joined check's, the one the leak penalty reads.

A file it cannot read stops it with one line naming the file (and the line and field) on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from agent_system.rewards.judge import JudgeConfig, add_judge_options, judge_from_options
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
    note: str = ""  # what the checks beside the rules said of it


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


def score_labelled(
    lines: Sequence[tuple[int, dict]], verdicts: np.ndarray, notes: Sequence[str] | None = None
) -> LabelledScore:
    """The verdicts (1.0 leak, 0.0 not) against the items' ``leak`` labels; ``notes``: what the report adds to each
    line's disagreement (:func:`check_notes`)."""
    score = LabelledScore(total=len(lines), leaks=0, caught=0, false_positives=0)
    notes = [""] * len(lines) if notes is None else notes
    for (number, item), verdict, note in zip(lines, verdicts, notes, strict=True):
        flagged = verdict == 1.0
        score.leaks += item["leak"]
        score.caught += item["leak"] and flagged
        score.false_positives += flagged and not item["leak"]
        if flagged != item["leak"]:
            score.disagreements.append(Disagreement(number, item, missed=item["leak"], note=note))
    return score


def check_notes(verdicts) -> list[str]:
    """Per feedback, what a disagreement says of the checks beside the rules: the ones that flagged it (``flagged by
    rules + judge``), the judge's NO or its lack of a verdict, the reader's gain; empty strings with the rules alone."""
    checks = {"rules": verdicts.rules, "judge": verdicts.judge, "reader": verdicts.reader}
    checks = {name: np.ravel(flags) for name, flags in checks.items() if flags is not None}
    if len(checks) == 1:
        return [""] * verdicts.leak.size
    notes = []
    for index in range(verdicts.leak.size):
        flagged = [name for name, flags in checks.items() if flags[index] == 1.0]
        parts = [f"flagged by {' + '.join(flagged)}"] if flagged else []
        if "judge" in checks and "judge" not in flagged:
            parts.append("judge NO" if checks["judge"][index] == 0.0 else "judge gave no verdict")
        if verdicts.reader_gain is not None:
            parts.append(f"reader gain {np.ravel(verdicts.reader_gain)[index]:.2f}")
        notes.append(", ".join(parts))
    return notes


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
        note = f", {item.note}" if item.note else ""
        lines.append(
            f"  line {item.line}: {what} (gold {item.item['ground_truth']}{note}): {_shown(item.item['feedback'])}"
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
    add_judge_options(parser, "leak judge")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="grading worker processes")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="wall-clock limit per candidate")
    return parser


def main(argv: Sequence[str] | None, pool, check: ModuleType) -> int:
    """The command (run as :func:`agent_system.rewards.leak.main`, which passes its own module as ``check``: the
    rules' verdicts and the trainer's ways of joining the judge's and the reader's to them); returns its exit status
    (0, or 2 for input it refuses). ``pool``: a RewardPool to grade with (tests); None: one of ``--workers`` processes
    is started after the file is read and closed at the end."""
    from agent_system.rewards import RewardPool

    parser = _parser()
    args = parser.parse_args(argv)
    if args.workers < 1 or not args.timeout_s > 0:
        parser.error(f"--workers {args.workers} --timeout-s {args.timeout_s}: need at least 1 worker and a time > 0")
    if not args.reader_threshold > 0:
        parser.error(f"--reader-threshold {args.reader_threshold}: a gain in nats, must be > 0")
    judge = _judge(parser, args)
    try:
        lines = read_labelled(args.score)
        reader = None if args.reader is None else _load_reader(args.reader)  # before any worker starts
    except LabelledFileError as error:
        sys.stderr.write(f"{parser.prog}: {error}\n")
        return 2
    items = [item for _, item in lines]
    if pool is None:
        with RewardPool(args.workers, args.timeout_s) as own_pool:
            rules = check.check_labelled(own_pool, items)
    else:
        rules = check.check_labelled(pool, items)
    verdicts = check.judged_verdicts(check.labelled_pairs(items), rules, judge)  # the rules' alone without a judge
    extra = [] if judge is None else [_judge_line(judge, verdicts, check)]
    if reader is not None:
        gains = _gains(reader, items)
        verdicts = check.with_reader(verdicts, gains, reader_verdicts(gains, args.reader_threshold))
        extra.append(
            f"reader {args.reader}: {int(np.nansum(verdicts.reader))}/{len(items)} feedbacks with a gain >= "
            f"{args.reader_threshold:g} nats (mean gain {float(np.mean(gains)):.2f} nats)"
        )
    page = report(score_labelled(lines, verdicts.leak, check_notes(verdicts)), args.score)
    sys.stdout.write("\n".join([*page[:-3], *extra, *page[-3:]]) + "\n")
    return 0


def _judge(parser: argparse.ArgumentParser, args: argparse.Namespace) -> JudgeConfig | None:
    """The leak judge the ``--judge-*`` options name, or None; their errors (:func:`judge_from_options`) stop the
    command with one line naming the options."""
    try:
        return judge_from_options(args)[0]
    except ValueError as error:
        parser.error(str(error))


def _judge_line(judge: JudgeConfig, verdicts, check: ModuleType) -> str:
    """The report's line of the judge's counts (:func:`agent_system.rewards.leak.judge_metrics`, the trainer's)."""
    counts = check.judge_metrics(verdicts)
    decided, fallbacks, added, disputed = (
        int(counts.get(f"leak_judge_{name}", 0)) for name in ("decided", "fallbacks", "added", "disputed")
    )
    return (
        f"leak judge {judge.model} at {judge.base_url}: {decided}/{verdicts.leak.size} decided, {fallbacks} failed "
        f"or fell back to the rules, {added} leaks added that the rules missed, {disputed} rule leaks disputed (they "
        "stay leaks)"
    )


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
