"""agent_system/demos (the relay demo's pieces, recipes/relay_demo/) on hand-written runs: the curve's figures per run
and step (useful feedback, R3, the solver's copy rate, the first three steps against the last three, right answers
without help over the second half, the first run's rise beyond its control's) against a hand computation, with the
table and the plot; the settings a run takes (an override replaces the demo's own); a task folder counts as built
only once its build finished; the null control's estimator moves rewards within a group only.

    .venv/bin/python -m pytest tests/unit/demos/test_relay_curve_on_cpu.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_system.demos.relay import TASK_FILE, built_task, task_paths, with_overrides
from agent_system.demos.relay_demo import main

GOLD = "42"


def _record(useful: bool, right: bool) -> dict:
    return {"feedback": "The answer is 42" if useful else "Check the answer", "ground_truth": GOLD, "R3": float(right)}


def _write_run(run: Path, steps: list[list[dict]]) -> Path:
    """A finished run as the trainer leaves it: trajectories/step_N.jsonl, and its console beside it (RUN.log)."""
    (run / "trajectories").mkdir(parents=True)
    lines = []
    for step, records in enumerate(steps, start=1):
        text = "".join(json.dumps(r) + "\n" for r in records)
        (run / "trajectories" / f"step_{step}.jsonl").write_text(text)
        r3 = sum(r["R3"] for r in records) / len(records)
        lines.append(f"step:{step} - train/acc@t1:0.0 - train/acc@t3:{r3} - hl/pg_loss:0.1")
    (run.parent / f"{run.name}.log").write_text("start-up\n" + "\n".join(lines) + "\nfinished\n")
    return run


def test_the_curve_of_a_learning_run_and_its_control(tmp_path):
    # 4 rows a step. mlmt: useful feedback on 1, 2, 3, 4, 4, 4 rows of steps 1-6, every useful row copied but on
    # step 1; control: useful on 1 row every step, copied, and one row right without help (step 5).
    learning = [[_record(i < n, i < n and (step > 1 or i > 0)) for i in range(4)] for step, n in
                enumerate([1, 2, 3, 4, 4, 4], start=1)]  # fmt: skip
    flat = [[_record(i == 0, i == 0) for i in range(4)] for _ in range(6)]
    flat[4][3] = _record(False, True)
    runs = {"mlmt": _write_run(tmp_path / "mlmt", learning), "permuted": _write_run(tmp_path / "permuted", flat)}
    main(["curve", "--out", str(tmp_path / "out"), *(f"--run={name}={run}" for name, run in runs.items())])

    result = json.loads((tmp_path / "out" / "relay_curve.json").read_text())
    mlmt, control = result["runs"]["mlmt"], result["runs"]["permuted"]
    assert [s["useful"] for s in mlmt["steps"]] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [s["R3"] for s in mlmt["steps"]] == [0.0, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [s["copy"] for s in mlmt["steps"]] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert mlmt["first_three"]["useful"] == pytest.approx(0.5) and mlmt["last_three"]["useful"] == 1.0
    assert mlmt["rise"]["useful"] == pytest.approx(0.5) and mlmt["rises"] == {"useful": True, "R3": True}
    assert control["rise"] == {"useful": 0.0, "R3": pytest.approx(0.25 / 3)} and control["rises"]["useful"] is False
    # steps 4-6: the rows whose feedback does not pass the gold on, pooled; the control's step-5 row was right
    assert mlmt["right_unhelped_second_half"]["rows"] == 0  # every late row's feedback passed the gold on
    assert control["right_unhelped_second_half"] == {"rate": pytest.approx(1 / 9), "right": 1.0, "rows": 9}
    # the first run's rise beyond its control's, on the same task: +0.50 in useful feedback, 0.58 - 0.08 in R3
    assert result["paired"] == [{"run": "mlmt", "against": "permuted", "useful": 0.5, "R3": pytest.approx(0.5)}]
    table = (tmp_path / "out" / "relay_curve.md").read_text()
    assert "mlmt's rise minus permuted's: useful feedback +0.50, R3 +0.50." in table
    assert "| mlmt | 6 | 0.50 → 1.00 (+0.50) | 0.42 → 1.00 (+0.58) | yes / yes |" in table
    assert "| permuted | 6 | 0.25 → 0.25 (+0.00) |" in table and "| 0.111 (1 of 9) |" in table
    assert "| – (0 of 0) |" in table  # mlmt's: no such row
    assert "| permuted | 5 | 0.25 | 0.00 | 0.50 | 1.00 | 0.33 |" in table
    assert (tmp_path / "out" / "relay_curve.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_without_step_lines_is_named(tmp_path):
    run = tmp_path / "mlmt"
    run.mkdir()
    (tmp_path / "mlmt.log").write_text("Traceback: the trainer stopped\n")
    with pytest.raises(FileNotFoundError, match="mlmt.log has no step line"):
        main(["curve", "--out", str(tmp_path / "out"), f"--run=mlmt={run}"])


def test_an_override_replaces_the_demos_setting_of_its_key():
    base = ["data.seed=0", "hl.actor.optim.lr=1e-4", "+mlmt.prompts.overrides.solve='Problem: {problem}'"]
    assert with_overrides(base, ["hl.actor.optim.lr=5e-5", "mlmt.m=4"]) == [
        "data.seed=0", "+mlmt.prompts.overrides.solve='Problem: {problem}'", "hl.actor.optim.lr=5e-5", "mlmt.m=4"
    ]  # fmt: skip


def test_a_task_counts_as_built_once_its_build_finished(tmp_path):
    Path(task_paths(tmp_path)["ll"]).mkdir()  # a build stopped half-way: models, no task.json
    assert built_task(tmp_path, 0) is None
    (tmp_path / TASK_FILE).write_text(json.dumps({"seed": 0, "solver": {}, "writer": {}}))
    assert built_task(tmp_path, 0) == task_paths(tmp_path) and built_task(tmp_path, 1) is None


def test_the_null_control_shuffles_rewards_within_each_group_only():
    from agent_system.demos.permuted_grpo import compute_permuted_grpo_advantage
    from agent_system.trainer.advantages import compute_advantages

    index = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    rewards = torch.zeros(8, 3)
    rewards[[0, 4, 5], 2] = 1.0  # a: one right of four; b: two of four (the reward on each row's last token)
    mask, config = torch.ones(8, 3), {"norm_adv_by_std_in_grpo": True}
    grpo, _ = compute_advantages("grpo", rewards, mask, index, config)
    seen = set()
    for _ in range(20):
        permuted, _ = compute_permuted_grpo_advantage(rewards, mask, index, config)
        for rows in (slice(0, 4), slice(4, 8)):  # each group keeps its advantages, in some order
            assert sorted(permuted[rows, 0].tolist()) == pytest.approx(sorted(grpo[rows, 0].tolist()))
        seen.add(tuple(permuted[:, 0].gt(0).tolist()))
    assert len(seen) > 1  # the rows they go to change from call to call
