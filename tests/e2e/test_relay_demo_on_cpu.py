"""The relay demo (recipes/relay_demo/run_relay_demo.sh) end to end, with few steps: both runs train with the same
settings but the null control's two, and the table, the JSON and the plot hold both runs' figures per step, as the
runs' own trajectories give them.

Marked ``extended``: the demo runs the path of the per-commit relay test
(test_learning_levels_on_cpu.py::test_feedback_writer_learns_while_the_solver_learns: the same task, warm-ups and
settings, with the learning asserted over 14 steps), and its null control is the study's ``permuted`` condition
(test_joint_learning_study_on_cpu.py). The task comes from the same fixture, copied into the demo's folder, so the
script's build step is checked to find it and skip the warm-ups.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_system.demos.relay import PERMUTED_CONTROL, step_series
from agent_system.demos.toy_run import parse_steps

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[2]


def test_relay_demo_trains_both_runs_and_writes_their_curve(relay_models, tmp_path):
    out, steps = tmp_path / "demo", 2
    shutil.copytree(Path(relay_models(0)["ll"]).parent, out / "task_seed0")
    env = {**os.environ, "MLMT_PYTHON": sys.executable}
    script = REPO / "recipes" / "relay_demo" / "run_relay_demo.sh"
    result = subprocess.run(["bash", str(script), "--out", str(out), "--steps", str(steps)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "warm-ups skipped" in result.stderr  # the task in --out is reused, not built again

    # the same settings but the control's (and each run's own folder and name)
    mlmt, permuted = (json.loads((out / f"{name}.settings.json").read_text()) for name in ("mlmt", "permuted"))
    own = ("trainer.default_local_dir=", "trainer.experiment_name=")
    mlmt, permuted = ([s for s in settings if not s.startswith(own)] for settings in (mlmt, permuted))
    assert permuted == mlmt + PERMUTED_CONTROL
    assert f"trainer.total_training_steps={steps}" in mlmt

    figures = json.loads((out / "relay_curve.json").read_text())
    assert list(figures["runs"]) == ["mlmt", "permuted"]
    for name, run in figures["runs"].items():
        metrics = parse_steps((out / f"{name}.log").read_text())
        assert "hl/pg_loss" in metrics[steps] and "ll/pg_loss" in metrics[steps]  # both levels updated
        # the figures are the run's own: its trajectories and its console's metrics
        assert [{k: v for k, v in s.items() if k != "step"} for s in run["steps"]] == step_series(
            out / name, metrics, steps
        )
        assert [s["step"] for s in run["steps"]] == list(range(1, steps + 1))
        assert all(0.0 <= s[key] <= 1.0 for s in run["steps"] for key in ("useful", "R3"))
        assert set(run["rise"]) == set(run["rises"]) == {"useful", "R3"}
    table = (out / "relay_curve.md").read_text()
    for name in ("mlmt", "permuted"):
        assert table.count(f"| {name} |") == 1 + steps, table  # its summary row and one row per step
    plot = (out / "relay_curve.png").read_bytes()
    assert plot.startswith(b"\x89PNG") and len(plot) > 20_000
    assert [line.split(":")[0] for line in (out / "wall_times.txt").read_text().splitlines()] == [
        "task of seed 0", "mlmt", "permuted", "all"
    ]  # fmt: skip
