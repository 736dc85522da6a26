"""Every parquet file the experiment scripts and recipes read by default, with held-out validation sets.

Usage (``examples/data_preprocess/prepare_all.sh`` runs this)::

    python -m agent_system.data.prepare --data ../shared/data --out data
    python -m agent_system.data.prepare --data ../shared/data --out data --seed 1 --math-val 500 --gsm8k-val 500

``--data`` holds the local JSONL files (``math/{train,test}.jsonl``, ``math500/test.jsonl``,
``gsm8k/{train,test}.jsonl``, ``mbpp/mbpp.jsonl``, ``mbpp/sanitized-mbpp.jsonl``). Written under ``--out``:

- ``math/train.parquet`` (MATH train), ``math/test.parquet`` (all 5,000 MATH test problems), ``math500/test.parquet``;
- ``math/val.parquet``: a seeded slice of the 4,500 MATH test problems that are not in MATH-500 (PRM800K's
  convention), the math scripts' validation set;
- ``gsm8k/train.parquet`` (GSM8K train less the validation slice), ``gsm8k/val.parquet`` (a seeded slice of GSM8K
  train), ``gsm8k/test.parquet``, and the same three with 5 solved examples before each question in ``gsm8k_5shot/``
  (the examples come from the reduced train set only);
- ``mbpp/train.parquet`` (task_ids 601-974), ``mbpp/val.parquet`` (511-600), ``mbpp/test.parquet`` (11-510),
  ``mbpp/mbpp.parquet`` (all 974 tasks, labelled by split) and ``mbpp/sanitized.parquet``.

A validation candidate whose id or normalised problem text (:mod:`agent_system.data.heldout`) is also in its training
set or in its evaluation set is left out, so every validation set is disjoint from both by measurement.
Validation rows carry ``extra_info.split = "validation"`` and ``extra_info.source_split`` (where they came from).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random

from agent_system.data.eval_sets import EVAL_SETS_FILE
from agent_system.data.heldout import ProblemSet, overlap, row_text, text_hash
from agent_system.data.preprocess import convert_rows
from agent_system.data.schema import write_parquet_atomic

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


# the local copies --data must hold (the datasets' own JSONL files)
INPUT_FILES = (
    "math/train.jsonl",
    "math/test.jsonl",
    "math500/test.jsonl",
    "gsm8k/train.jsonl",
    "gsm8k/test.jsonl",
    "mbpp/mbpp.jsonl",
    "mbpp/sanitized-mbpp.jsonl",
)


def missing_inputs_message(data_dir: str, out_dir: str, missing: list[str]) -> str:
    """What ``--data`` lacks and the two ways to the data: local copies laid out as :data:`INPUT_FILES`, or one file
    at a time from the Hugging Face hub."""
    where = "does not exist" if not os.path.isdir(data_dir) else f"lacks {', '.join(missing)}"
    return (
        f"--data {data_dir} {where}. This command converts local copies of MATH, MATH-500, GSM8K and MBPP laid out "
        f"as {', '.join(INPUT_FILES)}: point --data at such a folder. Online, make one file at a time from the "
        f"Hugging Face hub instead, e.g. python -m agent_system.data.preprocess --dataset math500 --output "
        f"{out_dir}/math500/test.parquet (--dataset math | math500 | gsm8k | mbpp with --split train | test)"
    )


# outputs of prepare_all that one preprocessor call from the hub also makes: name -> (--dataset, --split)
_FROM_HUB = {
    "math/train.parquet": ("math", "train"),
    "math/test.parquet": ("math", "test"),
    "math500/test.parquet": ("math500", "test"),
    "gsm8k/test.parquet": ("gsm8k", "test"),
}
_OUTPUTS = (
    *_FROM_HUB,
    "math/val.parquet",
    "gsm8k/train.parquet",
    "gsm8k/val.parquet",
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
    folder it writes to), else the preprocessor's; the hub command too where one preprocessor call makes it."""
    normalised = path.replace(os.sep, "/")
    name = next((n for n in _OUTPUTS if normalised == n or normalised.endswith("/" + n)), None)
    if name is None:
        return (
            "make it with python -m agent_system.data.preprocess --dataset math|math500|gsm8k|mbpp|mbpp_sanitized|"
            f"yaml --output {path} [--input LOCAL_FILE] (without --input it reads the Hugging Face hub)"
        )
    folder = normalised[: -len(name)].rstrip("/") or "."
    advice = (
        f"make it with bash examples/data_preprocess/prepare_all.sh LOCAL_DATA_DIR {folder} (every data file, "
        "with the held-out validation sets, from local copies of the datasets; see python -m agent_system.data."
        "prepare --help)"
    )
    if name in _FROM_HUB:
        dataset, split = _FROM_HUB[name]
        advice += (
            f", or online: python -m agent_system.data.preprocess --dataset {dataset} --split {split} --output {path}"
        )
    return advice


def prepare_all(
    data_dir: str, out_dir: str, seed: int = DEFAULT_SEED, math_val: int = MATH_VAL, gsm8k_val: int = GSM8K_VAL
) -> dict[str, str]:
    """Writes every default data file (see the module docstring).

    Returns:
        ``{path relative to out_dir: absolute path}`` of every file written.
    """

    missing = [name for name in INPUT_FILES if not os.path.isfile(os.path.join(data_dir, name))]
    if missing:
        raise FileNotFoundError(missing_inputs_message(data_dir, out_dir, missing))

    def read(dataset: str, name: str, skip_bad_rows: bool = False) -> list[dict]:
        return convert_rows(dataset, os.path.join(data_dir, name), None, skip_bad_rows=skip_bad_rows)[0]

    files: dict[str, list[dict]] = {}
    math_train = read("math", "math/train.jsonl", skip_bad_rows=True)  # 2 of 7,500 solutions have no \boxed{}
    math_test = read("math", "math/test.jsonl")
    math500 = read("math500", "math500/test.jsonl")
    files["math/train.parquet"], files["math/test.parquet"], files["math500/test.parquet"] = (
        math_train,
        math_test,
        math500,
    )
    files["math/val.parquet"] = split_math(math_train, math_test, math500, math_val, seed)

    gsm8k_test = read("gsm8k", "gsm8k/test.jsonl")
    gsm8k_train, gsm8k_validation = split_gsm8k(read("gsm8k", "gsm8k/train.jsonl"), gsm8k_test, gsm8k_val, seed)
    files["gsm8k/train.parquet"], files["gsm8k/val.parquet"] = gsm8k_train, gsm8k_validation
    files["gsm8k/test.parquet"] = gsm8k_test
    for name in ("train", "val", "test"):
        files[f"gsm8k_5shot/{name}.parquet"] = _few_shot(files[f"gsm8k/{name}.parquet"], gsm8k_train, seed)

    mbpp = read("mbpp", "mbpp/mbpp.jsonl")
    files["mbpp/mbpp.parquet"] = mbpp
    parts = split_mbpp(mbpp)
    files["mbpp/train.parquet"], files["mbpp/val.parquet"] = parts["train"], parts["validation"]
    files["mbpp/test.parquet"] = parts["test"]
    files["mbpp/sanitized.parquet"] = read("mbpp_sanitized", "mbpp/sanitized-mbpp.jsonl")

    written = {}
    for name, rows in files.items():
        written[name] = write_parquet_atomic(rows, os.path.join(out_dir, name))
        logger.info("wrote %d rows to %s", len(rows), written[name])
    return written


def eval_sets_json(data_dir: str) -> str:
    """The text of ``eval_sets.json`` (read by :mod:`agent_system.data.eval_sets`) computed from the local JSONL
    files (``--write-eval-sets``): each set's values sorted, one per line."""
    math500 = convert_rows("math500", os.path.join(data_dir, "math500/test.jsonl"))[0]
    gsm8k = convert_rows("gsm8k", os.path.join(data_dir, "gsm8k/test.jsonl"))[0]
    mbpp = split_mbpp(convert_rows("mbpp", os.path.join(data_dir, "mbpp/mbpp.jsonl"))[0])["test"]
    sets = {
        "MATH500_UNIQUE_IDS": [r["extra_info"]["unique_id"] for r in math500],
        "MATH500_TEXT": [text_hash(row_text(r)) for r in math500],
        "GSM8K_TEST_TEXT": [text_hash(row_text(r)) for r in gsm8k],
        "MBPP_TEST_TEXT": [text_hash(row_text(r)) for r in mbpp],
    }
    return json.dumps({name: sorted(set(values)) for name, values in sets.items()}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder of the local JSONL files (e.g. ../shared/data)")
    parser.add_argument("--out", default="data", help="output folder (the scripts' DATA_DIR)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the validation slices")
    parser.add_argument("--math-val", type=int, default=MATH_VAL, help="MATH validation problems (from test \\ 500)")
    parser.add_argument("--gsm8k-val", type=int, default=GSM8K_VAL, help="GSM8K validation problems (from train)")
    parser.add_argument("--write-eval-sets", action="store_true", help=f"regenerate {EVAL_SETS_FILE} and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.write_eval_sets:
        with open(EVAL_SETS_FILE, "w", encoding="utf-8") as handle:
            handle.write(eval_sets_json(args.data))
        return
    try:
        prepare_all(args.data, args.out, args.seed, args.math_val, args.gsm8k_val)
    except FileNotFoundError as error:  # the message names what is missing and how to make it
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
