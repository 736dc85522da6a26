"""The comparison's statistics and table (agent_system/comparisons/compare.py) on hand-made evaluation results: the
mean and spread over seeds, the 95 % interval over problems, the exact paired test against MLMT, the leak rate, the
marks on columns a method's objective shapes, and a rerun that keeps the minutes a run trained.

    .venv/bin/python -m pytest tests/unit/comparisons/test_compare_table_on_cpu.py
"""

from __future__ import annotations

import math

import pytest

from agent_system.comparisons import compare
from agent_system.comparisons.budget import BudgetEntry


def _metrics(final: float, leak: float | None = None) -> dict:
    metrics = {c: 0.25 for c in compare.OTHER_COLUMNS} | {"greedy_final_acc": final}
    return metrics | ({} if leak is None else {"leak_rate": leak})


def _result(seed: int, finals: list[int], leak: float | None = None) -> compare.SeedResult:
    per_problem = {f"p{i}": float(v) for i, v in enumerate(finals)}
    return compare.SeedResult(seed, 1.5, _metrics(sum(finals) / len(finals), leak), per_problem)


def _entry(name: str, shaped: bool) -> BudgetEntry:
    return BudgetEntry(
        baseline=name,
        problems_per_step=2,
        steps=4,
        generations_per_step=40,
        ll_generations_per_step=24,
        ll_optimizer_steps_per_update=1,
        hl_optimizer_steps_per_update=1,
        optimizer_steps_per_run={"ll": 4, "hl": 4},
        n=4,
        m=2,
        estimator={"ll": "grpo", "hl": "grpo"},
        temperature={"ll": 1.0, "hl": 1.0},
        lr={"ll": 5e-7, "hl": 5e-7},
        critic={"ll": "none", "hl": "none"},
        turn1_shaped=shaped,
        fixed="",
    )


MLMT = [_result(0, [1, 1, 1, 1, 1, 1, 0, 0], leak=0.125), _result(1, [1, 1, 1, 1, 1, 0, 0, 0], leak=0.0)]
OTHER = [_result(0, [0, 0, 0, 0, 0, 0, 0, 0]), _result(1, [1, 0, 0, 0, 0, 0, 0, 0])]


def test_a_row_has_the_seed_spread_the_interval_and_the_paired_test():
    row = compare.result_row("grpo", OTHER, MLMT, _entry("grpo", False))
    assert row["final_acc_per_seed"] == [0.0, 0.125] and row["final_acc"] == pytest.approx(0.0625)
    assert row["final_acc_sd"] == pytest.approx(math.sqrt(2 * 0.0625**2))  # sample sd of 0 and 0.125
    assert (row["final_acc_min"], row["final_acc_max"]) == (0.0, 0.125)
    low, high, method = row["final_acc_ci95"]
    assert method == "bootstrap" and low == 0.0 and 0.0625 < high <= 0.1875  # per-problem means 0.5 and 0s
    # per problem over seeds: MLMT 1, 1, 1, 1, 1, 0.5, 0, 0; grpo 0.5, 0, ... : MLMT higher on 6, grpo on none
    test = row["vs_mlmt"]
    assert (test["shared_problems"], test["mlmt_better"], test["baseline_better"]) == (8, 6, 0)
    assert test["p_value"] == pytest.approx(2 / 2**6)  # exact two-sided sign test
    assert row["leak_rate"] is None  # no feedback writer evaluated
    mlmt = compare.result_row("mlmt", MLMT, None, _entry("mlmt", True))
    assert mlmt["vs_mlmt"] is None and mlmt["leak_rate"] == pytest.approx(0.0625)


def test_one_seed_has_no_spread_and_a_wilson_interval():
    row = compare.result_row("mlmt", MLMT[:1], None, _entry("mlmt", True))
    assert row["final_acc_sd"] is None and row["final_acc_ci95"][2] == "wilson"


def test_the_table_marks_shaped_columns_and_not_held_out(tmp_path):
    args = compare.parse_args(["--out", str(tmp_path), "--seeds", "2", "--baselines", "mlmt,grpo"])
    rows = [
        compare.result_row("mlmt", MLMT, None, _entry("mlmt", True)),
        compare.result_row("grpo", OTHER, MLMT, _entry("grpo", False)),
    ]
    entries = [_entry("mlmt", True), _entry("grpo", False)]
    compare.write_outputs(tmp_path, rows, entries, args, "**Not held out:** 2 of the 8 evaluated problems ...")
    table = (tmp_path / "comparison.md").read_text()
    assert table.index("## Budget") < table.index("## Results")  # the budget opens the comparison
    assert "seeds 0, 1" in table and "**Not held out:**" in table
    mlmt_line = next(line for line in table.splitlines() if line.startswith("| mlmt | feedback |"))
    grpo_line = next(line for line in table.splitlines() if line.startswith("| grpo | single |"))
    assert "**0.688** ± 0.088" in mlmt_line and "| 0.062 |" in mlmt_line  # final mean ± sd; leak rate
    assert mlmt_line.count("†") == 3 and "†" not in grpo_line  # acc@t1, Δ and i→c under a progress bonus
    assert "6 / 0, p = 0.0312" in grpo_line and "| – |" in grpo_line  # the paired test; no leak rate
    assert (tmp_path / "comparison.png").stat().st_size > 0


def test_a_rerun_keeps_the_minutes_of_a_trained_run(tmp_path):
    """A finished run is not retrained on a rerun; its minutes are read back (None when it was never timed)."""
    for name, recorded in (("grpo", "3.25\n"), ("score", None)):
        checkpoints = tmp_path / name / "checkpoints"
        checkpoints.mkdir(parents=True)
        (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
        if recorded:
            (tmp_path / name / "train_minutes.txt").write_text(recorded)
    assert compare.train(["unused"], "grpo", tmp_path / "grpo", 2) == 3.25
    assert compare.train(["unused"], "score", tmp_path / "score", 2) is None


@pytest.mark.parametrize("option", ["--seeds", "--optimizer-steps", "--n", "--steps"])
def test_counts_below_one_are_refused_by_name(option, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        compare.parse_args(["--out", str(tmp_path), option, "0"])
    assert stopped.value.code == 2 and f"{option} 0: use 1 or more" in capsys.readouterr().err
