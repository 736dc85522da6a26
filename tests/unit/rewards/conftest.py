"""Fixtures of the reward tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def outside_tmp() -> Path:
    """A world-readable folder outside ``/tmp`` (in the repository's git-ignored ``outputs/``), where a file the
    sandbox must not touch stands as the data and checkpoints do: a victim under ``/tmp`` is hidden by the sandbox's
    private ``/tmp`` alone, so a test planting it there passes whatever else the sandbox does."""
    outputs = REPO / "outputs"
    outputs.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sandbox_victim_", dir=outputs))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
