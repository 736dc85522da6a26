"""Held-out checks on verl parquet rows: which rows two sets share, and which training rows come from a test split.

Overlap is measured, never assumed from file names: two rows are the same problem when they share an id (MATH's
``extra_info.unique_id``, MBPP's ``extra_info.task_id``) or the hash of their normalised problem text (lower case,
whitespace collapsed; ``extra_info.question`` when present, so a few-shot prompt is compared by its own question).
The known evaluation sets (MATH-500, GSM8K test, MBPP test) are embedded in
:mod:`agent_system.data.eval_sets` so a run can be checked against them without the evaluation file at hand.

The trainer calls :func:`validation_warnings` (its start-up line says "validation set = evaluation set: do not pick
checkpoints on it" when the validation rows are evaluation rows) and :func:`check_train_splits` (training rows whose
``extra_info.split`` is a test split are refused unless ``data.allow_test_split_in_train=true``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd
import pyarrow.parquet as pq

TEST_SPLITS = frozenset({"test"})
ALLOW_KEY = "data.allow_test_split_in_train"
VAL_IS_EVAL = "validation set = evaluation set: do not pick checkpoints on it"


def normalise_problem(text: str) -> str:
    """The problem text compared across sets: lower case, every run of whitespace one space, stripped."""
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def text_hash(text: str) -> str:
    """A short hash of :func:`normalise_problem` (16 hex digits of SHA-1)."""
    return hashlib.sha1(normalise_problem(text).encode("utf-8")).hexdigest()[:16]


def _extra(row: dict) -> dict:
    extra = row.get("extra_info")
    return extra if isinstance(extra, dict) else {}


def row_id(row: dict) -> str | None:
    """A row's dataset id: ``uid:<unique_id>`` (MATH, MATH-500), ``mbpp:<task_id>``, or None (GSM8K, custom tasks)."""
    extra = _extra(row)
    unique_id = str(extra.get("unique_id") or "")
    if unique_id:
        return f"uid:{unique_id}"
    task_id = extra.get("task_id")
    if row.get("data_source") == "mbpp" and task_id is not None and int(task_id) >= 0:
        return f"mbpp:{int(task_id)}"
    return None


def row_text(row: dict) -> str:
    """The problem text of a row: ``extra_info.question`` if set, else the user message."""
    question = _extra(row).get("question")
    if isinstance(question, str) and question.strip():
        return question
    prompt = row.get("prompt")
    return str(list(prompt)[0]["content"]) if prompt is not None and len(prompt) else ""


@dataclass(frozen=True)
class ProblemSet:
    """The ids and text hashes of a set of problems (from rows, or an embedded evaluation set)."""

    name: str
    ids: frozenset[str]
    text_hashes: frozenset[str]

    @classmethod
    def of_rows(cls, name: str, rows: Iterable[dict]) -> ProblemSet:
        rows = list(rows)
        ids = frozenset(i for i in (row_id(r) for r in rows) if i)
        return cls(name, ids, frozenset(text_hash(row_text(r)) for r in rows))

    @classmethod
    def of_frame(cls, name: str, frame: pd.DataFrame) -> ProblemSet:
        return cls.of_rows(name, frame.to_dict(orient="records"))


@dataclass(frozen=True)
class Overlap:
    """How many of ``rows`` rows of one set are in another: by id, by normalised text, and by either."""

    rows: int
    by_id: int
    by_text: int
    either: int


def overlap(rows: Sequence[dict] | pd.DataFrame, other: ProblemSet) -> Overlap:
    """Counts the rows of ``rows`` whose id or normalised problem text is in ``other``."""
    if isinstance(rows, pd.DataFrame):
        rows = rows.to_dict(orient="records")
    by_id = by_text = either = 0
    for row in rows:
        in_id = row_id(row) in other.ids
        in_text = text_hash(row_text(row)) in other.text_hashes
        by_id += in_id
        by_text += in_text
        either += in_id or in_text
    return Overlap(len(rows), by_id, by_text, either)


def known_eval_sets() -> list[ProblemSet]:
    """The embedded evaluation sets: MATH-500, GSM8K test, MBPP test (task_ids 11-510)."""
    from agent_system.data import eval_sets

    return [
        ProblemSet("MATH-500", frozenset(f"uid:{u}" for u in eval_sets.MATH500_UNIQUE_IDS), eval_sets.MATH500_TEXT),
        ProblemSet("GSM8K test", frozenset(), eval_sets.GSM8K_TEST_TEXT),
        ProblemSet("MBPP test", frozenset(f"mbpp:{t}" for t in range(11, 511)), eval_sets.MBPP_TEST_TEXT),
    ]


def validation_warnings(
    val_frame: pd.DataFrame | None,
    train_frame: pd.DataFrame | None,
    eval_files: Sequence[str] = (),
) -> list[str]:
    """Start-up warnings about the validation rows, measured by id and by normalised text.

    Args:
        val_frame: The rows of ``data.val_files`` (None: no validation, no warning).
        train_frame: The rows of ``data.train_files``.
        eval_files: More evaluation parquet files to check against (e.g. the file the run will be evaluated on).

    Returns:
        One message per set the validation rows overlap; a message on an evaluation set starts with
        "validation set = evaluation set: do not pick checkpoints on it".
    """
    if val_frame is None or not len(val_frame):
        return []
    val_rows = val_frame.to_dict(orient="records")
    sets = known_eval_sets() + [ProblemSet.of_frame(path, pd.read_parquet(path)) for path in eval_files]
    messages = []
    for other in sets:
        found = overlap(val_rows, other)
        if found.either:
            messages.append(
                f"{VAL_IS_EVAL} (data.val_files: {found.either} of {found.rows} rows are in {other.name}: "
                f"{found.by_id} by id, {found.by_text} by problem text)"
            )
    if train_frame is not None and len(train_frame):
        found = overlap(val_rows, ProblemSet.of_frame("data.train_files", train_frame))
        if found.either:
            messages.append(
                f"validation set overlaps the training set: {found.either} of {found.rows} data.val_files rows are "
                f"in data.train_files ({found.by_id} by id, {found.by_text} by problem text)"
            )
    return messages


class TrainOnTestSplitError(ValueError):
    """Training rows from a test split; the message names each file, the count and the key that allows them."""


def check_train_splits(train_files: str | Sequence[str] | None, allow: bool = False) -> dict[str, int]:
    """Refuses training files holding rows whose ``extra_info.split`` is a test split.

    Args:
        train_files: ``data.train_files`` (one path or a list).
        allow: ``data.allow_test_split_in_train``: count such rows but do not refuse them.

    Returns:
        ``{file: number of test-split rows}`` for every file holding some.

    Raises:
        TrainOnTestSplitError: naming each file and its count, unless ``allow``.
    """
    if not train_files:
        return {}
    paths = [train_files] if isinstance(train_files, str) else list(train_files)
    found = {}
    for path in paths:
        location = os.path.expanduser(path)
        if "extra_info" not in pq.read_schema(location).names:  # rows without extra_info name no split
            continue
        frame = pd.read_parquet(location, columns=["extra_info"])
        count = sum(1 for extra in frame["extra_info"] if isinstance(extra, dict) and extra.get("split") in TEST_SPLITS)
        if count:
            found[path] = count
    if found and not allow:
        listed = "; ".join(f"{path}: {count} of its rows" for path, count in found.items())
        raise TrainOnTestSplitError(
            f"data.train_files holds rows whose extra_info.split is a test split ({sorted(TEST_SPLITS)}): {listed}. "
            f"Train on the train split (examples/data_preprocess/prepare_all.sh), or set {ALLOW_KEY}=true to train "
            "on them anyway (an evaluation on those problems is then not held out)"
        )
    return found
