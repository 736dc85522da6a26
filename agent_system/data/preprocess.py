"""Convert MATH, MATH-500, GSM8K, MBPP and YAML-defined tasks to verl's RL parquet schema (agent_system/data/schema.py).

Usage::

    # from local files (a JSONL/parquet file or a folder holding them)
    python -m agent_system.data.preprocess --dataset math --input LOCAL_DATA_DIR/math --split train \
        --output data/math/train.parquet
    python -m agent_system.data.preprocess --dataset math500 --input LOCAL_DATA_DIR/math500 \
        --output data/math500/test.parquet
    python -m agent_system.data.preprocess --dataset gsm8k --input LOCAL_DATA_DIR/gsm8k/test.jsonl \
        --output data/gsm8k/test.parquet
    # GSM8K with 5 solved train examples before each question (recipes/reinforce_kl; agent_system/envs/gsm8k.py)
    python -m agent_system.data.preprocess --dataset gsm8k --input LOCAL_DATA_DIR/gsm8k/test.jsonl \
        --few-shot 5 --few-shot-pool LOCAL_DATA_DIR/gsm8k/train.jsonl --output data/gsm8k_5shot/test.parquet
    python -m agent_system.data.preprocess --dataset mbpp --input LOCAL_DATA_DIR/mbpp --split test \
        --output data/mbpp/test.parquet
    python -m agent_system.data.preprocess --dataset mbpp_sanitized --input LOCAL_DATA_DIR/mbpp \
        --output data/mbpp_sanitized/all.parquet
    # a task defined in YAML (recurve's format, agent_system/data/yaml_task.py); --split labels the rows (default train)
    python -m agent_system.data.preprocess --dataset yaml --input recipes/custom_yaml/arith_words.yaml \
        --output data/custom_yaml/arith_words.parquet
    # from the Hugging Face hub (online machines only): leave out --input
    python -m agent_system.data.preprocess --dataset gsm8k --split test --output data/gsm8k/test.parquet

A bad record stops the run with an error naming the file, the row (1-based line for JSONL, 1-based
record for parquet) and the field; ``--skip-bad-rows`` skips such records and reports how many and which.
The output is written to a temporary file in the same folder and renamed, so it is never half-written.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
from collections.abc import Iterable, Iterator

import pandas as pd
from tqdm import tqdm

from agent_system.data.schema import DataFormatError, RowError, write_parquet_atomic
from agent_system.data.sources import DATASETS, DatasetSpec
from agent_system.data.yaml_task import load_task, task_rows

logger = logging.getLogger(__name__)

_KNOWN_SPLITS = ("train", "test", "validation", "prompt")


def _input_files(input_path: str, spec: DatasetSpec, split: str | None) -> list[str]:
    """Resolves ``--input`` (a file or a folder) to the data files to read."""
    if os.path.isfile(input_path):
        return [input_path]
    if not os.path.isdir(input_path):
        raise FileNotFoundError(
            f"--input {input_path} does not exist: give a local copy of the dataset (a JSONL or parquet file, or a "
            f"folder holding {_names(spec, split)}), or leave out --input to read {spec.hub_path} from the Hugging "
            "Face hub (network needed)"
        )
    stems = [s.format(split=split) for s in spec.local_names if split or "{split}" not in s]
    files = [
        path
        for stem in stems
        for path in (os.path.join(input_path, stem + ext) for ext in (".jsonl", ".parquet"))
        if os.path.isfile(path)
    ]
    if not files and not stems:  # e.g. math without --split: every file of the folder
        files = sorted(glob.glob(os.path.join(input_path, "*.jsonl")))
        files += sorted(glob.glob(os.path.join(input_path, "*.parquet")))
    if not files:
        raise FileNotFoundError(
            f"--input {input_path} holds none of {_names(spec, split)}: give the file itself with --input FILE, or "
            f"leave out --input to read {spec.hub_path} from the Hugging Face hub (network needed)"
        )
    return files


def _names(spec: DatasetSpec, split: str | None) -> str:
    """The file names ``--input FOLDER`` is searched for, e.g. ``test.jsonl / test.parquet``."""
    stems = [s.format(split=split) for s in spec.local_names if split or "{split}" not in s] or ["*"]
    return " / ".join(f"{stem}{ext}" for stem in stems for ext in (".jsonl", ".parquet"))


def read_file(path: str) -> Iterator[tuple[int, dict | DataFormatError]]:
    """Yields (1-based row number, record) pairs of a JSONL or parquet file; an undecodable row yields a
    DataFormatError instead."""
    if path.endswith(".parquet"):
        for number, record in enumerate(pd.read_parquet(path).to_dict(orient="records"), start=1):
            yield number, record
        return
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, DataFormatError(path, number, "<json>", f"invalid JSON ({exc.msg})")
                continue
            if not isinstance(record, dict):
                yield number, DataFormatError(path, number, "<json>", "a row must be a JSON object")
                continue
            yield number, record


def _split_label(record: dict, spec: DatasetSpec, path: str, split: str | None) -> str:
    label = spec.split_of(record) if spec.split_of else ""
    if not label:
        stem = os.path.basename(path).split(".")[0].split("-")[0]
        label = stem if stem in _KNOWN_SPLITS else (split or "train")
    return label


# one input record: (source file or hub address, 1-based row number, the record or its DataFormatError, split label)
Record = tuple[str, int, object, str]


def local_records(input_path: str, spec: DatasetSpec, split: str | None) -> Iterator[Record]:
    """The records of a local file or folder (``--input``), each labelled by its split (kept: only ``split``'s)."""
    for path in _input_files(input_path, spec, split):
        for number, record in read_file(path):
            if isinstance(record, DataFormatError):
                yield path, number, record, split or ""
                continue
            try:
                label = _split_label(record, spec, path, split)
            except (TypeError, ValueError) as exc:
                yield path, number, DataFormatError(path, number, "task_id", str(exc)), split or ""
                continue
            if split is None or label == split:
                yield path, number, record, label


class HubUnavailableError(ConnectionError):
    """The Hugging Face hub could not give the dataset (offline machine, unknown split); the message names --input."""


def _hub_records(spec: DatasetSpec, split: str | None) -> Iterator[Record]:
    """Streams records from the Hugging Face hub (needs network access; not exercised by the tests)."""
    from datasets import load_dataset

    split = split or spec.default_split
    try:
        dataset = load_dataset(spec.hub_path, spec.hub_config, split=split)
    except OSError as error:  # ConnectionError offline, FileNotFoundError for an unknown split or dataset
        raise HubUnavailableError(
            f"could not read {spec.hub_path} (split {split}) from the Hugging Face hub: {error}. Offline, download "
            "it where the hub is reachable and pass the file or folder with --input (e.g. --input "
            f"/path/to/{spec.hub_path.rsplit('/', 1)[-1]}/{spec.default_split}.jsonl)"
        ) from None
    source = f"hf://{spec.hub_path}[{spec.hub_config or 'default'}]/{split}"
    for number, record in enumerate(dataset, start=1):
        yield source, number, dict(record), split


def convert_rows(
    dataset: str,
    input_path: str | None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad_rows: bool = False,
) -> tuple[list[dict], list[DataFormatError]]:
    """Converts one dataset's records to verl rows in memory (:func:`preprocess` without the writing).

    Args:
        dataset: One of :data:`agent_system.data.sources.DATASETS`.
        input_path: Local JSONL/parquet file or folder; None reads the Hugging Face hub.
        split: Keep only this split (local) or load this split (hub); None keeps every row, labelled by its split.
        limit: Keep at most this many rows.
        skip_bad_rows: Skip unconvertible records instead of stopping at the first one.

    Returns:
        ``(rows, skipped-row errors)``.

    Raises:
        DataFormatError: On the first bad record, unless ``skip_bad_rows``.
        ValueError: If the dataset is unknown or no row is left.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted([*DATASETS, 'yaml'])}")
    spec = DATASETS[dataset]
    records = local_records(input_path, spec, split) if input_path else _hub_records(spec, split)
    rows, bad = convert_records(dataset, records, limit, skip_bad_rows)
    if not rows:
        raise ValueError(f"no rows to write for dataset {dataset!r} (split={split!r})")
    return rows, bad


def convert_records(
    dataset: str, records: Iterable[Record], limit: int | None = None, skip_bad_rows: bool = False
) -> tuple[list[dict], list[DataFormatError]]:
    """Converts records already read (a local file, a folder laid out as the hub repository, the hub) to verl rows.

    Args:
        dataset: One of :data:`agent_system.data.sources.DATASETS`.
        records: ``(source, row number, record or its DataFormatError, split label)`` tuples.
        limit: Keep at most this many rows.
        skip_bad_rows: Skip unconvertible records instead of stopping at the first one.

    Returns:
        ``(rows, skipped-row errors)``.
    """
    convert = DATASETS[dataset].convert
    rows, bad = [], []
    for path, number, record, label in tqdm(records, desc=f"{dataset}", unit="row", mininterval=1.0):
        if limit is not None and len(rows) >= limit:
            break
        try:
            if isinstance(record, DataFormatError):
                raise record
            try:
                rows.append(convert(record, len(rows), label))
            except RowError as exc:
                raise DataFormatError(path, number, exc.field, exc.message) from None
        except DataFormatError as exc:
            if not skip_bad_rows:
                raise
            bad.append(exc)
    if bad:
        listed = "; ".join(str(e) for e in bad[:100]) + (f"; ... and {len(bad) - 100} more" if len(bad) > 100 else "")
        logger.warning("skipped %d bad rows: %s", len(bad), listed)
    return rows, bad


def preprocess(
    dataset: str,
    output: str,
    input_path: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad_rows: bool = False,
    few_shot: int = 0,
    few_shot_pool: str | None = None,
    few_shot_seed: int = 0,
) -> tuple[str, int, list[DataFormatError]]:
    """Converts one dataset to a verl parquet file.

    Args:
        dataset: One of ``math``, ``math500``, ``gsm8k``, ``mbpp``, ``mbpp_sanitized``, ``yaml`` (a task file:
            ``input_path`` is the YAML file; :mod:`agent_system.data.yaml_task`).
        output: Destination ``.parquet`` path.
        input_path: Local JSONL/parquet file or folder; None reads the Hugging Face hub.
        split: Keep only this split (local) or load this split (hub).
        limit: Keep at most this many rows (small slices for tests).
        skip_bad_rows: Skip unconvertible records instead of stopping at the first one.
        few_shot: GSM8K only: put this many solved examples from ``few_shot_pool`` (a GSM8K JSONL, the train
            split) before each question, chosen per row by ``few_shot_seed`` (``agent_system.envs.gsm8k``).

    Returns:
        ``(output path, number of rows written, skipped-row errors)``.

    Raises:
        DataFormatError: On the first bad record, unless ``skip_bad_rows``.
        ValueError: If no row is left to write.
    """
    if dataset == "yaml":
        if not input_path:
            raise ValueError("--dataset yaml needs --input TASK.yaml")
        rows = task_rows(load_task(input_path), split or "train", limit)
        return write_parquet_atomic(rows, output), len(rows), []
    rows, bad = convert_rows(dataset, input_path, split, limit, skip_bad_rows)
    if few_shot:
        from agent_system.envs.gsm8k import add_few_shot, load_gsm8k

        if dataset != "gsm8k" or not few_shot_pool:
            raise ValueError("--few-shot is for --dataset gsm8k and needs --few-shot-pool (the train JSONL)")
        add_few_shot(rows, load_gsm8k(few_shot_pool), few_shot, few_shot_seed)
    return write_parquet_atomic(rows, output), len(rows), bad


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets = sorted([*DATASETS, "yaml"])
    parser.add_argument("--dataset", required=True, choices=datasets, help="dataset (yaml: a task file)")
    parser.add_argument("--input", default=None, help="local JSONL/parquet file or folder (default: the HF hub)")
    parser.add_argument("--output", required=True, help="output .parquet path")
    parser.add_argument("--split", default=None, help="keep (local) or load (hub) only this split")
    parser.add_argument("--limit", type=int, default=None, help="write at most this many rows")
    parser.add_argument("--skip-bad-rows", action="store_true", help="skip and report bad records instead of failing")
    parser.add_argument("--few-shot", type=int, default=0, help="gsm8k: solved examples before each question")
    parser.add_argument("--few-shot-pool", default=None, help="gsm8k: JSONL the examples come from (train split)")
    parser.add_argument("--few-shot-seed", type=int, default=0, help="gsm8k: seed of each row's choice of examples")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path, count, bad = preprocess(
            args.dataset,
            args.output,
            args.input,
            args.split,
            args.limit,
            args.skip_bad_rows,
            args.few_shot,
            args.few_shot_pool,
            args.few_shot_seed,
        )
    except OSError as error:  # a missing --input, an unreachable hub: the message names the fix
        parser.exit(2, f"error: {error}\n")
    logger.info("wrote %d rows to %s (%d bad rows skipped)", count, path, len(bad))


if __name__ == "__main__":
    main()
