"""agent_system/comparisons/learning_curve.py on hand-written validation records: accuracies, standard errors,
truncation shares and the paired tests checked against a hand computation; the CLI writes the table and the plot; the
recipe recipes/learning_demo/run_learning_demo.sh gives both runs the same settings but the freeze and never mixes
runs.

    .venv/bin/python -m pytest tests/unit/comparisons/test_learning_curve_on_cpu.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from agent_system.comparisons.learning_curve import learning_curves, main, markdown, standard_error


def _record(problem: int, r1: float, r3: float, cut_attempt: bool = False) -> dict:
    return {
        "problem": f"What is {problem} + 1?",
        "R1": r1,
        "R3": r3,
        "truncated": {"attempt": cut_attempt, "feedback": False, "refinement": False},
    }


def _write_run(run: Path, steps: dict[int, list[dict]]) -> Path:
    (run / "trajectories").mkdir(parents=True)
    for step, records in steps.items():
        lines = "".join(json.dumps(r) + "\n" for r in records)
        (run / "trajectories" / f"val_step_{step}.jsonl").write_text(lines)
    (run / "trajectories" / "step_1.jsonl").write_text("")  # a training step's file: not a validation
    return run


# 8 problems. Step 0: R1 right on 0, 1 (2/8); R3 right on 0, 1, 2, 3 (4/8); problems 0-5 cut at turn 1 (6/8).
# Step 4: R1 right on 0-4 (5/8); R3 right on 0-6 (7/8); nothing cut.
STEP0 = [_record(i, float(i < 2), float(i < 4), cut_attempt=i < 6) for i in range(8)]
STEP4 = [_record(i, float(i < 5), float(i < 7)) for i in range(8)]
# a second run, at step 4: R1 right on 0 only (1/8), R3 right on 0, 1 (2/8)
OTHER4 = [_record(i, float(i < 1), float(i < 2)) for i in range(8)]


def test_standard_error_is_that_of_a_proportion():
    assert standard_error(0.25, 64) == pytest.approx(math.sqrt(0.25 * 0.75 / 64)) == pytest.approx(0.0541266)
    assert standard_error(0.0, 64) == 0.0 and standard_error(1.0, 8) == 0.0


def test_curves_accuracies_standard_errors_and_paired_tests(tmp_path):
    a = _write_run(tmp_path / "a", {0: STEP0, 4: STEP4})
    b = _write_run(tmp_path / "b", {0: STEP0, 4: OTHER4})
    result = learning_curves({"mlmt": a, "frozen_hl": b})
    first, last = result["curves"]["mlmt"]
    assert [first["step"], last["step"]] == [0, 4] and first["problems"] == 8
    assert first["acc@t1"] == 0.25 and first["final_acc"] == 0.5
    assert first["acc@t1_se"] == pytest.approx(math.sqrt(0.25 * 0.75 / 8))  # 0.1531
    assert first["final_acc_se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 8))  # 0.1768
    assert last["acc@t1"] == 0.625 and last["final_acc"] == 0.875
    assert last["final_acc_se"] == pytest.approx(math.sqrt(0.875 * 0.125 / 8))  # 0.1169
    assert first["truncated"] == {"attempt": 0.75, "feedback": 0.0, "refinement": 0.0}
    assert result["curves"]["frozen_hl"][1]["acc@t1"] == 0.125
    tests = {(t["what"], t["key"]): t for t in result["paired_tests"]}
    # mlmt step 0 vs step 4, turn 1: problems 2, 3, 4 went right, none went wrong -> p = 2 · (1/2)^3 = 0.25
    within = tests[("mlmt step 0 vs step 4", "R1")]
    assert (within["shared"], within["a_better"], within["b_better"]) == (8, 0, 3)
    assert within["p_value"] == pytest.approx(0.25)
    # mlmt vs frozen_hl at step 4, final: mlmt right on 2-6 where frozen_hl is wrong (5 discordant) -> p = 2/32
    across = tests[("mlmt vs frozen_hl at step 4", "R3")]
    assert (across["a_better"], across["b_better"]) == (5, 0) and across["p_value"] == pytest.approx(0.0625)
    # the table names A and B in the order of its counts (it once read "step 4 vs step 0" over step 0's count first)
    table = markdown(result)
    assert "| exact paired test (McNemar): A vs B | turn | shared | right on A only | right on B only | p |" in table
    assert "| mlmt step 0 vs step 4 | t1 | 8 | 0 | 3 | 0.250 |" in table
    assert "| mlmt vs frozen_hl at step 4 | final | 8 | 5 | 0 | 0.062 |" in table


def test_a_problem_twice_in_one_validation_is_refused(tmp_path):
    run = _write_run(tmp_path / "a", {0: [*STEP0, STEP0[0]]})
    with pytest.raises(ValueError, match="appear twice"):
        learning_curves({"mlmt": run})


def test_records_without_truncation_flags_report_none(tmp_path):
    bare = [{k: v for k, v in r.items() if k != "truncated"} for r in STEP0]
    result = learning_curves({"mlmt": _write_run(tmp_path / "a", {0: bare})})
    assert result["curves"]["mlmt"][0]["truncated"] == {"attempt": None, "feedback": None, "refinement": None}
    assert result["paired_tests"] == []  # one validation: nothing to compare


def test_cli_writes_the_table_json_and_plot(tmp_path):
    a = _write_run(tmp_path / "a", {0: STEP0, 4: STEP4})
    b = _write_run(tmp_path / "b", {0: STEP0, 4: OTHER4})
    main(["--out", str(tmp_path / "out"), "--run", f"mlmt={a}", "--run", f"frozen_hl={b}"])
    table = (tmp_path / "out" / "learning_curve.md").read_text()
    assert "| mlmt | 4 | 8 | 0.625 ± 0.171 | 0.875 ± 0.117 | 0.00 / 0.00 / 0.00 |" in table
    assert "| mlmt | 0 | 8 | 0.250 ± 0.153 | 0.500 ± 0.177 | 0.75 / 0.00 / 0.00 |" in table
    saved = json.loads((tmp_path / "out" / "learning_curve.json").read_text())
    assert saved["curves"]["frozen_hl"][1]["final_acc"] == 0.25
    assert (tmp_path / "out" / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.external
def test_the_recipe_runs_both_with_the_same_settings_and_refuses_other_settings_in_the_same_out(tmp_path):
    """recipes/learning_demo/run_learning_demo.sh with a stub interpreter that records its argv (nothing trains)."""
    stub, record = tmp_path / "python-stub", tmp_path / "argv"
    stub.write_text('#!/usr/bin/env bash\nif [[ "$2" == verl.trainer.main_mlmt ]]; then echo "$@" >> "$RECORD"; fi\n')
    stub.chmod(0o755)
    env = {**os.environ, "MLMT_PYTHON": str(stub), "RECORD": str(record)}
    script = str(Path(__file__).resolve().parents[3] / "recipes" / "learning_demo" / "run_learning_demo.sh")
    out = tmp_path / "demo"
    run = [script, "--out", str(out), "--steps", "3", "mlmt.n=4"]
    assert subprocess.run(["bash", *run], env=env, capture_output=True, text=True, timeout=60).returncode == 0
    mlmt, frozen = (line.split() for line in record.read_text().splitlines())
    assert mlmt[-2:] == [f"trainer.default_local_dir={out}/mlmt", "trainer.experiment_name=learning_demo_mlmt"]
    assert frozen[-1] == "mlmt.hl.freeze=true" and frozen[: len(mlmt) - 2] == mlmt[:-2]  # only the freeze differs
    assert {"trainer.total_training_steps=3", "mlmt.dataset.n_val=64", "mlmt.n=4"} <= set(mlmt)
    assert mlmt.index("mlmt.n=4") > mlmt.index("mlmt.n=2")  # the user's override comes last: it wins
    refused = subprocess.run(["bash", *run[:-1], "mlmt.n=2"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "other settings" in refused.stderr
