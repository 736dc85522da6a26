"""verl's RL parquet row schema, shared by every preprocessor and the embedded default dataset.

A row::

    {"data_source": "math",
     "prompt": [{"role": "user", "content": <raw problem, no instruction suffix>}],
     "ability": "math" | "code" | "custom",
     "reward_model": {"style": "rule", "ground_truth": <str>},
     "extra_info": {"index": int, "split": str, "reference_solution": str, "question": str, ...}}
"""

from __future__ import annotations

import os
import tempfile

import pandas as pd

ABILITIES = ("math", "code", "custom")  # custom: a task defined in YAML (agent_system.data.yaml_task)
REQUIRED_EXTRA_KEYS = ("index", "split", "reference_solution")


class RowError(ValueError):
    """A problem with one field of one input record."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.message = message


class DataFormatError(ValueError):
    """An input record that cannot be converted; the message names the file, the row and the field."""

    def __init__(self, path: str, row: int, field: str, message: str) -> None:
        super().__init__(f"{path}: row {row}: field {field!r}: {message}")
        self.path, self.row, self.field = path, row, field


def make_row(data_source: str, problem: str, ability: str, ground_truth: str, extra_info: dict) -> dict:
    """Builds one verl row.

    Args:
        data_source: Canonical data source name (selects the reward in ``compute_score``).
        problem: The raw problem text, sent as the single user message.
        ability: ``"math"`` or ``"code"``.
        ground_truth: The gold answer, or the JSON string of the assert list for code.
        extra_info: Must hold ``index``, ``split`` and ``reference_solution``.

    Returns:
        The row dict (validated).
    """
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": problem}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": dict(extra_info),
    }
    validate_row(row)
    return row


def validate_row(row: dict) -> None:
    """Checks a verl row.

    Raises:
        RowError: Naming the first bad field.
    """
    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        raise RowError("data_source", "must be a non-empty string")
    prompt = row.get("prompt")
    if not (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], dict)):
        raise RowError("prompt", "must be a one-message chat list")
    if prompt[0].get("role") != "user" or not isinstance(prompt[0].get("content"), str) or not prompt[0]["content"]:
        raise RowError("prompt", "the message must be a non-empty user message")
    if row.get("ability") not in ABILITIES:
        raise RowError("ability", f"must be one of {ABILITIES}")
    reward = row.get("reward_model")
    if not isinstance(reward, dict) or reward.get("style") != "rule":
        raise RowError("reward_model", "must be {'style': 'rule', 'ground_truth': str}")
    if not isinstance(reward.get("ground_truth"), str) or not reward["ground_truth"].strip():
        raise RowError("reward_model.ground_truth", "must be a non-empty string")
    extra = row.get("extra_info")
    if not isinstance(extra, dict):
        raise RowError("extra_info", "must be a dict")
    for key in REQUIRED_EXTRA_KEYS:
        if key not in extra:
            raise RowError(f"extra_info.{key}", "is missing")


def write_parquet_atomic(rows: list[dict], output: str) -> str:
    """Writes rows to parquet without ever leaving a half-written file at ``output``.

    The table goes to a temporary file in the same directory, then ``os.replace`` renames it.

    Args:
        rows: verl rows.
        output: Destination path; parent directories are created.

    Returns:
        The absolute output path.
    """
    output = os.path.abspath(output)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=".tmp_", suffix=".parquet", dir=os.path.dirname(output))
    os.close(fd)
    try:
        pd.DataFrame(rows).to_parquet(tmp_path, index=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp creates 0600; give the file normal permissions
        os.replace(tmp_path, output)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    return output
