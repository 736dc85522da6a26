"""The benchmark data beside the repository (``../shared/data``; ``MLMT_SHARED_DATA`` overrides), for the tests that
read it: ``shared_data("math500", "test.jsonl")`` is that path, and a test asking for data that is absent skips,
naming the path (a clone without the data). Where CI runs (``CI`` set), absent data fails instead: CI has it, and its
tests must run there. Tests reading it are marked ``external`` (tests/_fast_tier.py): a bare ``pytest`` leaves
them out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("MLMT_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def shared_data(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        reason = f"needs the benchmark data at {path} (../shared/data beside the repository, or MLMT_SHARED_DATA)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path
