"""Fixtures of the integration tier shared by several test files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("MLMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


@pytest.fixture(scope="module")
def math500_dir(tmp_path_factory):
    """$DATA_DIR with math500/test.parquet: the first 4 MATH-500 problems."""
    from agent_system.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("data")
    preprocess(
        "math500", str(root / "math500" / "test.parquet"), input_path=str(SHARED / "math500" / "test.jsonl"), limit=4
    )
    return root
