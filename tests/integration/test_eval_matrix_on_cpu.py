"""The cross-pair table on real MATH-500 rows: ``eval_math500.sh --matrix`` with two tiny solvers whose paths share
their last parts, × (a tiny feedback writer, none), on the hf server; then the same command again, which reuses
every pair's records (no problem evaluated twice, no model loaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "mlmt-configs" / "math" / "eval_math500.sh"


def test_matrix_command_writes_the_table_and_reuses_the_pairs(tiny_models, math500_dir, tmp_path):
    runs = {"A/export/global_step_5/ll": "ll", "B/export/global_step_5/ll": "hl", "A/export/global_step_5/hl": "hl"}
    for path, model in runs.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).symlink_to(tiny_models[model], target_is_directory=True)
    lls = f"{tmp_path}/A/export/global_step_5/ll,{tmp_path}/B/export/global_step_5/ll"
    out = tmp_path / "matrix"
    command = ["bash", str(SCRIPT), "--matrix", lls, "--hl", f"{tmp_path}/A/export/global_step_5/hl,none"]
    command += ["--out", str(out), "--limit", "3", "--engine", "hf", "--batch-size", "3"]
    command += ["--max-tokens", "12", "--feedback-tokens", "12", "--max-prompt-tokens", "2048"]
    env = {**os.environ, "MLMT_PYTHON": sys.executable, "DATA_DIR": str(math500_dir)}

    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "MATH-500 eval" in first.stderr, first.stderr[-3000:]
    table = json.loads((out / "matrix.json").read_text())
    solvers, writers = ["A_export_global_step_5_ll", "B_export_global_step_5_ll"], ["global_step_5_hl", "none"]
    assert [m["name"] for m in table["solvers"]] == solvers
    assert [m["name"] for m in table["feedback_writers"]] == writers
    assert [(p["ll"], p["hl"]) for p in table["pairs"]] == [(ll, hl) for ll in solvers for hl in writers]
    records = {}
    for pair in table["pairs"]:
        folder = out / pair["folder"]
        records[folder] = (folder / "records.jsonl").read_text()
        assert len(records[folder].splitlines()) == 3  # every pair on the same 3 problems
        metrics = json.loads((folder / "summary.json").read_text())["metrics"]
        assert pair["problems"] == 3 and pair["final_acc"] == metrics["greedy_final_acc"]
        assert pair["delta_t1_final"] == metrics["delta_t1_final"] and pair["i_to_c"] == metrics["i_to_c"]
        if pair["hl"] == "none":  # the solver alone: one turn
            assert pair["rounds"] == 0 and pair["leak_rate"] is None
            assert pair["final_acc"] == pair["t1_acc"] and pair["delta_t1_final"] == pair["i_to_c"] == 0
        else:
            assert pair["rounds"] == 1 and 0 <= pair["leak_rate"] <= 1
    assert "| solver \\ feedback | global_step_5_hl | none |" in first.stdout
    assert first.stdout == (out / "matrix.md").read_text()
    assert imread(out / "matrix.png").shape[:2] > (100, 100)

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count("resuming: 3 of 3 problems already in") == 4, second.stderr[-3000:]
    assert "MATH-500 eval" not in second.stderr  # no progress bar: nothing generated, no model loaded
    assert all((folder / "records.jsonl").read_text() == text for folder, text in records.items())
    assert json.loads((out / "matrix.json").read_text()) == table and second.stdout == first.stdout
