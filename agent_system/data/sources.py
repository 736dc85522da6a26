"""Per-dataset record converters: one raw record (hub or local JSONL/parquet) -> one verl row.

Each converter raises :class:`agent_system.data.schema.RowError` naming the bad field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from agent_system.data.schema import RowError, make_row
from agent_system.rewards.math_answer import gsm8k_gold, last_boxed_content


def _text(record: dict, field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value.strip():
        raise RowError(field, "missing or not a non-empty string")
    return value


def _math_row(data_source: str, record: dict, index: int, split: str, answer: str) -> dict:
    extra = {
        "index": index,
        "split": split,
        "reference_solution": record["solution"],
        "question": record["problem"],
        "level": str(record.get("level", "")),
        "subject": str(record.get("type") or record.get("subject") or ""),
        "unique_id": str(record.get("unique_id", "")),
    }
    return make_row(data_source, record["problem"], "math", answer, extra)


def convert_math(record: dict, index: int, split: str) -> dict:
    """MATH (Hendrycks): the gold answer is the last ``\\boxed{}`` of the reference solution."""
    _text(record, "problem")
    answer = last_boxed_content(_text(record, "solution"))
    if not answer or not answer.strip():
        raise RowError("solution", "has no \\boxed{} final answer")
    return _math_row("math", record, index, split, answer.strip())


def convert_math500(record: dict, index: int, split: str) -> dict:
    """MATH-500: uses its ``answer`` field."""
    _text(record, "problem")
    _text(record, "solution")
    return _math_row("math500", record, index, split, _text(record, "answer").strip())


def convert_gsm8k(record: dict, index: int, split: str) -> dict:
    """GSM8K: the gold is the ``#### N`` of ``answer`` (commas removed); the rationale is the reference."""
    question = _text(record, "question")
    answer = _text(record, "answer")
    gold = gsm8k_gold(answer)
    if not gold:
        raise RowError("answer", "has no '#### N' final answer")
    extra = {"index": index, "split": split, "reference_solution": answer, "question": question}
    return make_row("gsm8k", question, "math", gold, extra)


def _entry_point(code: str, tests: list[str]) -> str:
    """The function of the reference code that the first test calls ('' if not derivable)."""
    for name in re.findall(r"^def\s+(\w+)\s*\(", code, flags=re.MULTILINE):
        if re.search(rf"\b{re.escape(name)}\s*\(", tests[0]):
            return name
    match = re.match(r"\s*assert\s+(?:\w+\()*?(\w+)\s*\(", tests[0])
    return match.group(1) if match else ""


def _tests(record: dict, field: str = "test_list") -> list[str]:
    tests = record.get(field)
    if hasattr(tests, "tolist"):  # parquet gives numpy arrays
        tests = tests.tolist()
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise RowError(field, "must be a non-empty list of test strings")
    return tests


def _code_row(record: dict, index: int, split: str, text: str, setup: str, variant: str) -> dict:
    tests = _tests(record)
    code = _text(record, "code").replace("\r\n", "\n")
    # the first test only, as an example of the function's name and signature (MBPP practice since InCoder, as in
    # the bigcode evaluation harness); the others stay hidden: a program hard-coding the shown assert earns nothing
    problem = text.strip() + "\n\nYour code should pass this test, among others:\n" + tests[0]
    extra = {
        "index": index,
        "split": split,
        "reference_solution": code,
        "question": problem,
        "test_setup_code": setup.replace("\r\n", "\n"),
        "entry_point": _entry_point(code, tests),
        "task_id": int(record.get("task_id", -1)),
        "variant": variant,
    }
    return make_row("mbpp", problem, "code", json.dumps(tests), extra)


def convert_mbpp(record: dict, index: int, split: str) -> dict:
    """MBPP full: the prompt is the task text plus its first assert (it names the function to write)."""
    setup = record.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise RowError("test_setup_code", "must be a string")
    return _code_row(record, index, split, _text(record, "text"), setup, "full")


def convert_mbpp_sanitized(record: dict, index: int, split: str) -> dict:
    """MBPP sanitized: ``test_imports`` becomes ``test_setup_code``."""
    imports = record.get("test_imports")
    if hasattr(imports, "tolist"):
        imports = imports.tolist()
    if imports is None:
        imports = []
    if not isinstance(imports, list):
        raise RowError("test_imports", "must be a list of import lines")
    return _code_row(record, index, split, _text(record, "prompt"), "\n".join(imports), "sanitized")


def mbpp_split(task_id: int) -> str:
    """MBPP's published split by task id: 1-10 prompt, 11-510 test, 511-600 validation, 601-974 train."""
    if task_id <= 10:
        return "prompt"
    if task_id <= 510:
        return "test"
    return "validation" if task_id <= 600 else "train"


@dataclass(frozen=True)
class DatasetSpec:
    """How to load and convert one dataset.

    Attributes:
        convert: Record converter.
        hub_path: ``datasets.load_dataset`` path; ``hub_config`` its config name.
        default_split: Split loaded from the hub when ``--split`` is not given.
        local_names: File stems looked up when ``--input`` is a directory (``{split}`` is substituted).
        split_of: Infers a record's split from the record itself (None: from the file name or --split).
    """

    convert: Callable[[dict, int, str], dict]
    hub_path: str
    hub_config: str | None
    default_split: str
    local_names: tuple[str, ...]
    split_of: Callable[[dict], str] | None = None


def _math_split(record: dict) -> str:
    uid = str(record.get("unique_id", ""))
    return uid.split("/", 1)[0] if "/" in uid else ""


DATASETS = {
    "math": DatasetSpec(convert_math, "DigitalLearningGmbH/MATH-lighteval", None, "train", ("{split}",), _math_split),
    "math500": DatasetSpec(convert_math500, "HuggingFaceH4/MATH-500", None, "test", ("test", "{split}")),
    "gsm8k": DatasetSpec(convert_gsm8k, "openai/gsm8k", "main", "train", ("{split}",)),
    "mbpp": DatasetSpec(
        convert_mbpp, "google-research-datasets/mbpp", "full", "train", ("mbpp",),
        lambda r: mbpp_split(int(r.get("task_id", 0))),
    ),
    "mbpp_sanitized": DatasetSpec(
        convert_mbpp_sanitized, "google-research-datasets/mbpp", "sanitized", "train", ("sanitized-mbpp",),
        lambda r: mbpp_split(int(r.get("task_id", 0))),
    ),
}  # fmt: skip
