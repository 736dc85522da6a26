"""Every parquet file the experiment scripts and recipes read by default, with held-out validation sets.

Usage, from the public datasets on the Hugging Face hub, a copy of them, or local JSONL copies::

    python -m agent_system.data.prepare --from-hub --out data
    python -m agent_system.data.prepare --from DIR --out data      # DIR/<owner>/<name>/...: agent_system/data/hub.py
    python -m agent_system.data.prepare --data LOCAL_DATA_DIR --out data --seed 1 --math-val 500 --gsm8k-val 500

The three routes give the same records (:mod:`agent_system.data.hub` turns the repositories' files into the local
files' records), then one code path (:func:`build_all`) writes the same files, byte for byte. ``--data`` holds the
local JSONL files (``math/{train,test}.jsonl``, ``math500/test.jsonl``, ``gsm8k/{train,test}.jsonl``,
``mbpp/mbpp.jsonl``, ``mbpp/sanitized-mbpp.jsonl``). Written under ``--out``:

- ``math/train.parquet`` (MATH train), ``math/test.parquet`` (all 5,000 MATH test problems), ``math500/test.parquet``;
- ``math/val.parquet``: a seeded slice of the 4,500 MATH test problems that are not in MATH-500 (PRM800K's
  convention), the math scripts' validation set;
- ``gsm8k/train.parquet`` (GSM8K train less the validation slice), ``gsm8k/val.parquet`` (a seeded slice of GSM8K
  train), ``gsm8k/test.parquet``, and the same three with 5 solved examples before each question in ``gsm8k_5shot/``
  (the examples come from the reduced train set only);
- ``mbpp/train.parquet`` (task_ids 601-974 less the tasks a constant passes, :mod:`agent_system.data.constant_answer`),
  ``mbpp/val.parquet`` (511-600), ``mbpp/test.parquet`` (11-510), ``mbpp/mbpp.parquet`` (all 974 tasks, labelled by
  split) and ``mbpp/sanitized.parquet``.

The report (logged) gives each file's rows and sha256, the MBPP tasks left out and the rows that could not be
converted.
A validation candidate whose id or normalised problem text (:mod:`agent_system.data.heldout`) is also in its training
set or in its evaluation set is left out, so every validation set is disjoint from both by measurement.
Validation rows carry ``extra_info.split = "validation"`` and ``extra_info.source_split`` (where they came from).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass

from agent_system.data.constant_answer import constant_answer_tasks
from agent_system.data.eval_sets import EVAL_SETS_FILE
from agent_system.data.heldout import ProblemSet, overlap, row_text, text_hash
from agent_system.data.hub import download_folders, layout_folders, repository_inputs
from agent_system.data.preprocess import Record, convert_records, local_records
from agent_system.data.schema import DataFormatError, write_parquet_atomic
from agent_system.data.sources import DATASETS

logger = logging.getLogger(__name__)

DEFAULT_SEED = 0
MATH_VAL = 500
GSM8K_VAL = 500
FEW_SHOT = 5


def _as_validation(rows: list[dict]) -> list[dict]:
    out = []
    for index, row in enumerate(rows):
        extra = {**row["extra_info"], "source_split": row["extra_info"]["split"], "split": "validation", "index": index}
        out.append({**row, "extra_info": extra})
    return out


def _reindexed(rows: list[dict]) -> list[dict]:
    return [{**row, "extra_info": {**row["extra_info"], "index": i}} for i, row in enumerate(rows)]


def _text_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        key = text_hash(row_text(row))
        counts[key] = counts.get(key, 0) + 1
    return counts


def _held_out(candidates: list[dict], excluded: list[ProblemSet]) -> list[dict]:
    """The candidates in none of ``excluded`` (by id or text) whose text is unique among the candidates."""
    counts = _text_counts(candidates)
    return [
        row
        for row in candidates
        if counts[text_hash(row_text(row))] == 1 and not any(overlap([row], other).either for other in excluded)
    ]


def _seeded_slice(rows: list[dict], count: int, seed: int, name: str) -> list[dict]:
    if count > len(rows):
        raise ValueError(f"{name}: cannot draw {count} validation problems from {len(rows)} candidates")
    picked = sorted(random.Random(f"{name}/{seed}").sample(range(len(rows)), count))
    return [rows[i] for i in picked]


def split_math(train: list[dict], test: list[dict], math500: list[dict], count: int, seed: int) -> list[dict]:
    """MATH validation: ``count`` seeded problems of MATH test not in MATH-500 nor in MATH train."""
    excluded = [ProblemSet.of_rows("MATH-500", math500), ProblemSet.of_rows("MATH train", train)]
    return _as_validation(_seeded_slice(_held_out(test, excluded), count, seed, "math"))


def split_gsm8k(train: list[dict], test: list[dict], count: int, seed: int) -> tuple[list[dict], list[dict]]:
    """GSM8K: (train less the validation slice, the validation slice of ``count`` seeded train problems).

    A train problem whose normalised text is repeated in train or is in the test set is never drawn.
    """
    counts = _text_counts(train)
    test_set = ProblemSet.of_rows("GSM8K test", test)
    candidates = [
        i
        for i, row in enumerate(train)
        if counts[text_hash(row_text(row))] == 1 and not overlap([row], test_set).either
    ]
    if count > len(candidates):
        raise ValueError(f"gsm8k: cannot draw {count} validation problems from {len(candidates)} candidates")
    picked = set(random.Random(f"gsm8k/{seed}").sample(candidates, count))
    kept = [row for i, row in enumerate(train) if i not in picked]
    val = [row for i, row in enumerate(train) if i in picked]
    return _reindexed(kept), _as_validation(val)


def split_mbpp(rows: list[dict]) -> dict[str, list[dict]]:
    """MBPP by its published split (``extra_info.split``): train 601-974, validation 511-600, test 11-510.

    A validation task whose normalised text is also in train or test is left out.
    """
    by_split: dict[str, list[dict]] = {}
    for row in rows:
        by_split.setdefault(row["extra_info"]["split"], []).append(row)
    excluded = [ProblemSet.of_rows("MBPP train", by_split["train"]), ProblemSet.of_rows("MBPP test", by_split["test"])]
    return {
        "train": _reindexed(by_split["train"]),
        "validation": _as_validation(_held_out(by_split["validation"], excluded)),
        "test": _reindexed(by_split["test"]),
    }


def _few_shot(rows: list[dict], pool_rows: list[dict], seed: int) -> list[dict]:
    from agent_system.envs.gsm8k import add_few_shot

    pool = [
        {"question": r["extra_info"]["question"], "answer": r["extra_info"]["reference_solution"]} for r in pool_rows
    ]
    copies = [{**r, "prompt": [dict(m) for m in r["prompt"]], "extra_info": dict(r["extra_info"])} for r in rows]
    return add_few_shot(copies, pool, FEW_SHOT, seed)


# the local copies --data must hold (the datasets' own JSONL files) -> the converter of each
INPUT_FILES = {
    "math/train.jsonl": "math",
    "math/test.jsonl": "math",
    "math500/test.jsonl": "math500",
    "gsm8k/train.jsonl": "gsm8k",
    "gsm8k/test.jsonl": "gsm8k",
    "mbpp/mbpp.jsonl": "mbpp",
    "mbpp/sanitized-mbpp.jsonl": "mbpp_sanitized",
}
Inputs = dict[str, list[Record]]  # input file name -> its records (from any route)


def missing_inputs_message(data_dir: str, missing: list[str]) -> str:
    """What ``--data`` lacks and the other routes to the data: a copy laid out as the hub (``--from``), the hub."""
    where = "does not exist" if not os.path.isdir(data_dir) else f"lacks {', '.join(missing)}"
    return (
        f"--data {data_dir} {where}. --data converts local copies of MATH, MATH-500, GSM8K and MBPP laid out as "
        f"{', '.join(INPUT_FILES)}: point it at such a folder, or read the public datasets instead: --from-hub "
        "(online), or --from DIR with a copy of the hub repositories (agent_system/data/hub.py names them)"
    )


def local_inputs(data_dir: str) -> Inputs:
    """The records of the local JSONL files under ``data_dir`` (``--data``).

    Raises:
        FileNotFoundError: A file of :data:`INPUT_FILES` is missing (before anything is read or written).
    """
    missing = [name for name in INPUT_FILES if not os.path.isfile(os.path.join(data_dir, name))]
    if missing:
        raise FileNotFoundError(missing_inputs_message(data_dir, missing))
    return {
        name: list(local_records(os.path.join(data_dir, name), DATASETS[dataset], None))
        for name, dataset in INPUT_FILES.items()
    }


_OUTPUTS = (
    "math/train.parquet",
    "math/test.parquet",
    "math500/test.parquet",
    "math/val.parquet",
    "gsm8k/train.parquet",
    "gsm8k/val.parquet",
    "gsm8k/test.parquet",
    "gsm8k_5shot/train.parquet",
    "gsm8k_5shot/val.parquet",
    "gsm8k_5shot/test.parquet",
    "mbpp/train.parquet",
    "mbpp/val.parquet",
    "mbpp/test.parquet",
    "mbpp/mbpp.parquet",
    "mbpp/sanitized.parquet",
)


class DataFileMissing(FileNotFoundError):
    """A data file a run names does not exist; the message says how to make it (:func:`how_to_make`)."""


def how_to_make(path: str) -> str:
    """How to make a missing data file: this module's command when it writes a file of that name (``DIR`` the
    folder it writes to), else the preprocessor's."""
    normalised = path.replace(os.sep, "/")
    name = next((n for n in _OUTPUTS if normalised == n or normalised.endswith("/" + n)), None)
    if name is None:
        return (
            "make it with python -m agent_system.data.preprocess --dataset math|math500|gsm8k|mbpp|mbpp_sanitized|"
            f"yaml --output {path} [--input LOCAL_FILE] (without --input it reads the Hugging Face hub)"
        )
    folder = normalised[: -len(name)].rstrip("/") or "."
    return (
        f"make it with python -m agent_system.data.prepare --from-hub --out {folder} (every data file, with the "
        "held-out validation sets, from the public datasets on the Hugging Face hub; offline: --from DIR, a copy of "
        "the hub repositories, or --data LOCAL_DATA_DIR, local JSONL copies; see its --help)"
    )


@dataclass(frozen=True)
class WrittenFile:
    """One file the preparation wrote: its absolute path, rows and the sha256 of its bytes."""

    path: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class PrepareReport:
    """What :func:`build_all` wrote and left out.

    Attributes:
        files: Output name (``math/train.parquet``) -> the file written.
        constant_answer_tasks: MBPP task_id -> the constant that passes all its tests, for the tasks left out of
            ``mbpp/train.parquet`` (:mod:`agent_system.data.constant_answer`).
        skipped_rows: The input rows that could not be converted (MATH train's two solutions without an answer).
    """

    files: dict[str, WrittenFile]
    constant_answer_tasks: dict[int, str]
    skipped_rows: list[str]

    def lines(self) -> list[str]:
        """The report as log lines: one per file, then what was left out."""
        out = [f"{name}: {f.rows} rows, sha256 {f.sha256}" for name, f in self.files.items()]
        dropped = self.constant_answer_tasks
        out.append(
            f"mbpp/train.parquet: left out {len(dropped)} tasks whose tests a constant passes (task_id: constant): "
            + (", ".join(f"{task}: {constant}" for task, constant in sorted(dropped.items())) or "none")
        )
        out.append(f"skipped {len(self.skipped_rows)} unconvertible rows: {'; '.join(self.skipped_rows) or 'none'}")
        return out


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _without_constant_answers(rows: list[dict]) -> tuple[list[dict], dict[int, str]]:
    """The rows less the tasks whose tests a constant passes, reindexed; and those tasks."""
    dropped = constant_answer_tasks(rows)
    return _reindexed([r for r in rows if int(r["extra_info"]["task_id"]) not in dropped]), dropped


def build_all(
    inputs: Inputs, out_dir: str, seed: int = DEFAULT_SEED, math_val: int = MATH_VAL, gsm8k_val: int = GSM8K_VAL
) -> PrepareReport:
    """Writes every default data file (see the module docstring) from the records of any route.

    Args:
        inputs: Input file name (:data:`INPUT_FILES`) -> its records (:func:`local_inputs`,
            :func:`agent_system.data.hub.repository_inputs`).
        out_dir: The folder written to.
        seed: Seed of the validation slices.
        math_val: MATH validation problems.
        gsm8k_val: GSM8K validation problems.
    """
    skipped: list[str] = []

    def read(name: str, skip_bad_rows: bool = False) -> list[dict]:
        rows, bad = convert_records(INPUT_FILES[name], inputs[name], skip_bad_rows=skip_bad_rows)
        skipped.extend(str(error) for error in bad)
        return rows

    files: dict[str, list[dict]] = {}
    math_train = read("math/train.jsonl", skip_bad_rows=True)  # 2 of 7,500 solutions have no \boxed{}
    math_test, math500 = read("math/test.jsonl"), read("math500/test.jsonl")
    files.update({"math/train.parquet": math_train, "math/test.parquet": math_test, "math500/test.parquet": math500})
    files["math/val.parquet"] = split_math(math_train, math_test, math500, math_val, seed)

    gsm8k_test = read("gsm8k/test.jsonl")
    gsm8k_train, gsm8k_validation = split_gsm8k(read("gsm8k/train.jsonl"), gsm8k_test, gsm8k_val, seed)
    files["gsm8k/train.parquet"], files["gsm8k/val.parquet"] = gsm8k_train, gsm8k_validation
    files["gsm8k/test.parquet"] = gsm8k_test
    for name in ("train", "val", "test"):
        files[f"gsm8k_5shot/{name}.parquet"] = _few_shot(files[f"gsm8k/{name}.parquet"], gsm8k_train, seed)

    mbpp = read("mbpp/mbpp.jsonl")
    files["mbpp/mbpp.parquet"] = mbpp
    parts = split_mbpp(mbpp)
    files["mbpp/train.parquet"], dropped = _without_constant_answers(parts["train"])
    files["mbpp/val.parquet"], files["mbpp/test.parquet"] = parts["validation"], parts["test"]
    files["mbpp/sanitized.parquet"] = read("mbpp/sanitized-mbpp.jsonl")

    written = {}
    for name, rows in files.items():
        path = write_parquet_atomic(rows, os.path.join(out_dir, name))
        written[name] = WrittenFile(path, len(rows), _sha256(path))
    report = PrepareReport(written, dropped, skipped)
    for line in report.lines():
        logger.info("%s", line)
    return report


def prepare_all(
    data_dir: str, out_dir: str, seed: int = DEFAULT_SEED, math_val: int = MATH_VAL, gsm8k_val: int = GSM8K_VAL
) -> PrepareReport:
    """:func:`build_all` from the local JSONL files under ``data_dir`` (``--data``)."""
    return build_all(local_inputs(data_dir), out_dir, seed, math_val, gsm8k_val)


def eval_sets_json(inputs: Inputs) -> str:
    """The text of ``eval_sets.json`` (read by :mod:`agent_system.data.eval_sets`) computed from the inputs
    (``--write-eval-sets``): each set's values sorted, one per line."""
    math500 = convert_records("math500", inputs["math500/test.jsonl"])[0]
    gsm8k = convert_records("gsm8k", inputs["gsm8k/test.jsonl"])[0]
    mbpp = split_mbpp(convert_records("mbpp", inputs["mbpp/mbpp.jsonl"])[0])["test"]
    sets = {
        "MATH500_UNIQUE_IDS": [r["extra_info"]["unique_id"] for r in math500],
        "MATH500_TEXT": [text_hash(row_text(r)) for r in math500],
        "GSM8K_TEST_TEXT": [text_hash(row_text(r)) for r in gsm8k],
        "MBPP_TEST_TEXT": [text_hash(row_text(r)) for r in mbpp],
    }
    return json.dumps({name: sorted(set(values)) for name, values in sets.items()}, indent=1) + "\n"


def read_inputs(args: argparse.Namespace) -> Inputs:
    """The records of the route the command line names: ``--data``, ``--from`` or ``--from-hub``."""
    if args.data:
        return local_inputs(args.data)
    folders = download_folders(args.hub_cache) if args.from_hub else layout_folders(args.from_dir)
    return repository_inputs(folders)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    route = parser.add_mutually_exclusive_group(required=True)
    route.add_argument("--from-hub", action="store_true", help="download the public datasets from the HF hub")
    route.add_argument("--from", dest="from_dir", help="a copy of the hub repositories: DIR/<owner>/<name>/...")
    route.add_argument("--data", help="folder of local JSONL copies (math/train.jsonl, ...)")
    parser.add_argument("--hub-cache", default=None, help="--from-hub: the hub cache folder (default: HF_HUB_CACHE)")
    parser.add_argument("--out", default="data", help="output folder (the scripts' DATA_DIR)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the validation slices")
    parser.add_argument("--math-val", type=int, default=MATH_VAL, help="MATH validation problems (from test \\ 500)")
    parser.add_argument("--gsm8k-val", type=int, default=GSM8K_VAL, help="GSM8K validation problems (from train)")
    parser.add_argument("--write-eval-sets", action="store_true", help=f"regenerate {EVAL_SETS_FILE} and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        inputs = read_inputs(args)
        if args.write_eval_sets:
            with open(EVAL_SETS_FILE, "w", encoding="utf-8") as handle:
                handle.write(eval_sets_json(inputs))
            return
        build_all(inputs, args.out, args.seed, args.math_val, args.gsm8k_val)
    except (OSError, DataFormatError) as error:  # the message names what is missing or bad and the way out
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
