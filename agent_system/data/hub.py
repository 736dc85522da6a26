"""The public Hugging Face hub repositories the data comes from, and their records in the local route's form.

``python -m agent_system.data.prepare --from-hub`` downloads the files of each repository of :data:`HUB_REPOS` (by
name, with ``huggingface_hub``, into its cache); ``--from DIR`` reads a copy of them laid out as the repositories are
(``DIR/<owner>/<name>/<file>``, what ``hf download <owner>/<name> --repo-type dataset --local-dir DIR/<owner>/<name>``
writes), for clusters without the hub. Both then go through :func:`repository_inputs`, which turns the files into the
records of the local JSONL files (:data:`agent_system.data.prepare.INPUT_FILES`), in their order and with their
fields, so the rest of the preparation is one code path whatever the route.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from agent_system.data.preprocess import Record, read_file
from agent_system.data.schema import DataFormatError
from agent_system.data.sources import DATASETS

MBPP_SPLITS = ("prompt", "test", "validation", "train")
MBPP_VARIANTS = ("full", "sanitized")


@dataclass(frozen=True)
class HubRepo:
    """A public dataset repository and the files of it that the preparation reads.

    Attributes:
        repo_id: ``owner/name`` on the hub (a dataset repository).
        licence: The dataset's licence.
        files: Part name -> glob of its files inside the repository (the hub's own folder layout).
    """

    repo_id: str
    licence: str
    files: dict[str, str]


HUB_REPOS = {
    # MATH in PRM800K's split, with MATH's unique_id: train = MATH train + the 4,500 MATH test problems not in
    # MATH-500, test = MATH-500; the unique_id prefix (train/, test/) gives each problem's MATH split
    "math": HubRepo("nlile/hendrycks-MATH-benchmark", "MIT", {"train": "data/train-*", "test": "data/test-*"}),
    "math500": HubRepo("HuggingFaceH4/MATH-500", "MIT", {"test": "test.jsonl"}),
    "gsm8k": HubRepo("openai/gsm8k", "MIT", {"train": "main/train-*", "test": "main/test-*"}),
    "mbpp": HubRepo(
        "google-research-datasets/mbpp",
        "CC-BY-4.0",
        {f"{variant}/{s}": f"{variant}/{s}-*" for variant in MBPP_VARIANTS for s in MBPP_SPLITS},
    ),
}


class HubLayoutError(FileNotFoundError):
    """A repository folder that lacks a file of :data:`HUB_REPOS` or holds records of another form."""


def repository_files(folder: str, repo: HubRepo) -> dict[str, list[str]]:
    """Part name -> the files of ``folder`` (a copy of ``repo``) that match the part's glob, sorted.

    Raises:
        HubLayoutError: A part has no file, naming the folder, the glob and how to get the repository.
    """
    found = {part: sorted(glob.glob(os.path.join(folder, pattern))) for part, pattern in repo.files.items()}
    missing = [repo.files[part] for part, paths in found.items() if not paths]
    if missing:
        raise HubLayoutError(
            f"{folder} has no {', '.join(missing)} (the layout of the hub repository {repo.repo_id}): copy the "
            f"repository there, e.g. hf download {repo.repo_id} --repo-type dataset --local-dir {folder}"
        )
    return found


def _plain(value: object) -> object:
    """A parquet value as the JSON reader gives it (numpy arrays and scalars to lists and Python scalars)."""
    return value.tolist() if hasattr(value, "tolist") else value


def _records(paths: list[str]) -> list[Record]:
    """The records of ``paths`` as ``(file, row, record, "")``; an undecodable row stays a DataFormatError."""
    out: list[Record] = []
    for path in paths:
        for number, record in read_file(path):
            if not isinstance(record, DataFormatError):
                record = {key: _plain(value) for key, value in record.items()}
            out.append((path, number, record, ""))
    return out


def _field(record: Record, field: str) -> object:
    path, number, value, _ = record
    if isinstance(value, DataFormatError):
        raise value
    if field not in value:
        raise DataFormatError(path, number, field, "missing (not the layout of the hub repository)")
    return value[field]


def _math_order(record: Record) -> tuple[str, int]:
    """MATH's released order (the local files'): subject folder, then the problem's file number."""
    unique_id = str(_field(record, "unique_id"))
    parts = unique_id.split("/")
    if len(parts) != 3 or not parts[2].removesuffix(".json").isdigit():
        path, number, _, _ = record
        raise DataFormatError(path, number, "unique_id", f"{unique_id!r} is not <split>/<subject>/<n>.json")
    return parts[1], int(parts[2].removesuffix(".json"))


def _level(level: object) -> str:
    """MATH's level text from the hub's number: 3 (or 3.0, where a missing level made the column float) -> "Level 3";
    missing -> "Level ?", as MATH's files write the two problems without a level."""
    if isinstance(level, str):
        return level
    if level is None or level != level:  # NaN
        return "Level ?"
    return f"Level {int(level)}"


def _as_math(record: Record) -> Record:
    """A MATH record in the fields of MATH's own files: ``level`` "Level N", ``type`` the subject."""
    path, number, value, label = record
    fields = {
        "problem": _field(record, "problem"),
        "level": _level(value.get("level")),
        "type": value.get("type") or _field(record, "subject"),
        "solution": _field(record, "solution"),
        "unique_id": _field(record, "unique_id"),
    }
    return path, number, fields, label


def _math_split(records: list[Record], split: str) -> list[Record]:
    """The problems of MATH's ``split`` among ``records`` (by the unique_id prefix), in MATH's order."""
    kept = [r for r in records if str(_field(r, "unique_id")).startswith(split + "/")]
    return [_as_math(r) for r in sorted(kept, key=_math_order)]


def _by_task_id(records: list[Record]) -> list[Record]:
    return sorted(records, key=lambda record: int(_field(record, "task_id")))


def repository_inputs(folders: dict[str, str]) -> dict[str, list[Record]]:
    """The records of each local input file (``math/train.jsonl`` ...), read from copies of the hub repositories.

    Args:
        folders: :data:`HUB_REPOS` key -> the folder holding that repository's files (a snapshot, or ``DIR/<repo>``).

    Returns:
        Input file name -> its records, as the local JSONL files hold them (same fields, same order).

    Raises:
        HubLayoutError: A folder lacks a file of its repository.
        DataFormatError: A record lacks a field the preparation needs (naming the file, the row and the field).
    """
    parts = {
        name: {part: _records(paths) for part, paths in repository_files(folders[name], repo).items()}
        for name, repo in HUB_REPOS.items()
    }
    math_all = parts["math"]["train"] + parts["math"]["test"]
    mbpp = {v: [r for s in MBPP_SPLITS for r in parts["mbpp"][f"{v}/{s}"]] for v in MBPP_VARIANTS}
    return {
        "math/train.jsonl": _labelled("math", _math_split(math_all, "train")),
        "math/test.jsonl": _labelled("math", _math_split(math_all, "test")),
        "math500/test.jsonl": _labelled("math500", parts["math500"]["test"], "test"),
        "gsm8k/train.jsonl": _labelled("gsm8k", parts["gsm8k"]["train"], "train"),
        "gsm8k/test.jsonl": _labelled("gsm8k", parts["gsm8k"]["test"], "test"),
        "mbpp/mbpp.jsonl": _labelled("mbpp", _by_task_id(mbpp["full"])),
        "mbpp/sanitized-mbpp.jsonl": _labelled("mbpp_sanitized", _by_task_id(mbpp["sanitized"])),
    }


def _labelled(dataset: str, records: list[Record], split: str = "") -> list[Record]:
    """Each record with its split label, as the local route gives it: from the record where the dataset says
    (MATH's unique_id, MBPP's task_id), else the part's split."""
    split_of = DATASETS[dataset].split_of
    return [(p, n, r, split_of(r) if split_of and isinstance(r, dict) else split) for p, n, r, _ in records]


def layout_folders(root: str) -> dict[str, str]:
    """Each repository's folder in a local copy laid out as the hub: ``root/<owner>/<name>``."""
    return {name: os.path.join(root, *repo.repo_id.split("/")) for name, repo in HUB_REPOS.items()}


class HubUnreachable(ConnectionError):
    """A repository could not be downloaded; the message names it and the ``--from DIR`` route."""


def download_folders(cache_dir: str | None = None) -> dict[str, str]:
    """Downloads the files of each repository of :data:`HUB_REPOS` (``huggingface_hub.snapshot_download``, only the
    files the preparation reads; a cached copy is reused, and is all that is read with ``HF_HUB_OFFLINE=1``).

    Args:
        cache_dir: The hub cache to use (default: ``HF_HUB_CACHE``, ``~/.cache/huggingface/hub``).

    Returns:
        Repository key -> its snapshot folder.
    """
    from huggingface_hub import snapshot_download

    folders = {}
    for name, repo in HUB_REPOS.items():
        try:
            folders[name] = snapshot_download(
                repo.repo_id, repo_type="dataset", allow_patterns=list(repo.files.values()), cache_dir=cache_dir
            )
        except Exception as error:  # noqa: BLE001 - offline, gated, not cached: one message with the way out
            raise HubUnreachable(
                f"could not download the dataset {repo.repo_id} from the Hugging Face hub ({type(error).__name__}): "
                "where the hub is not reachable, copy the repositories elsewhere (hf download "
                f"{repo.repo_id} --repo-type dataset --local-dir DIR/{repo.repo_id}, one per repository) and run "
                "python -m agent_system.data.prepare --from DIR"
            ) from None
    return folders
