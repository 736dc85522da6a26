"""The run plan of every experiment script (mlmt-configs/{math,code}/*.sh): each stage it declares is reached, each
trained level is updated and its lr schedule is completed (peak reached, horizon = its updates), and start-up
accepts it (issue 16, item 2 and the pre-flight plan).

Each script runs through bash with MLMT_PYTHON set to a stub that records the argv it would give
`python -m verl.trainer.main_mlmt`; that argv is composed in-process as the entry point does. The training-set sizes
are those of the files `examples/data_preprocess/prepare_all.sh` writes (MATH train: 7,500 problems; MBPP train:
374), which epochs-mode runs count their steps from.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent_system.trainer.config import compose_config, validate_config
from agent_system.trainer.main import check_stages_reached, set_schedule_horizon
from agent_system.trainer.plan import build_plan, render_markdown

pytestmark = pytest.mark.external  # runs the bash experiment scripts

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    str(path.relative_to(REPO / "mlmt-configs"))
    for path in [*(REPO / "mlmt-configs" / "math").glob("HL*.sh"), *(REPO / "mlmt-configs" / "code").glob("*.sh")]
)
TRAIN_ROWS = {"math": 7500, "code": 374}


def _argv(script: str, tmp_path: Path) -> list[str]:
    record, stub = tmp_path / "argv", tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    env = {**os.environ, "MLMT_PYTHON": str(stub), "ARGV_RECORD": str(record)}
    result = subprocess.run(["bash", str(REPO / "mlmt-configs" / script)], env=env, capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "verl.trainer.main_mlmt"]
    return argv[2:]


def test_every_experiment_script_is_listed():
    assert len(SCRIPTS) >= 9 and "code/HLT_LLT_RR_mbpp.sh" in SCRIPTS and "math/HLT_LLT_RR_1_15.sh" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_plan_reaches_every_stage_and_completes_each_lr_schedule(script, tmp_path):
    config = compose_config(_argv(script, tmp_path))
    validate_config(config)
    rows = TRAIN_ROWS[script.split("/")[0]]
    set_schedule_horizon(config, rows)
    check_stages_reached(config, rows)  # start-up's data-dependent check
    plan = build_plan(config, rows, 500)
    text = render_markdown(plan)
    assert all(stage.reached for stage in plan.stages), text
    assert "NEVER REACHED" not in text and "NOT COMPLETED" not in text, text
    if len(plan.stages) > 1:  # the SCoRe stages: stage II starts where the script says, within the run
        assert plan.stages[-1].first_step == config.mlmt.stages.schedule[-1] <= plan.total_steps, text
        assert plan.stages[-1].alpha > 0, text  # α acts in stage II
    for level in plan.levels.values():
        if level.frozen:
            assert level.updates == 0 and level.lr is None, text
            continue
        assert level.updates > 0 and level.lr.completed and level.lr.horizon == level.updates, text
        assert level.lr.peak == pytest.approx(level.lr.setting), text
        assert level.optimizer_steps_per_update >= 1 and level.mini_batch <= level.mini_batch_setting, text
    assert plan.checkpoint_steps[-1] == plan.total_steps, text


# (SCoRe stage id, β on turn 1, turn 2, turn 3) of each stage: the seed's β1 / β2 / β_L / β_H as the run plan put them
# on each turn before the keys were renamed (docs/CONFIG.md)
SCORE_BETAS = [(1, 0.1, 0.0, 0.01), (2, 0.01, 0.0, 0.01)]
PLAN_BETAS = {script: SCORE_BETAS for script in SCRIPTS} | {"math/HLT_LLF_RR_1_1.sh": [(2, 0.0, 0.0, 0.0)]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_sets_the_per_turn_betas_it_always_had(script, tmp_path, caplog):
    argv = _argv(script, tmp_path)
    assert not [arg for arg in argv if arg.split("=")[0].split(".")[-1] in ("beta1", "beta2", "beta_l", "beta_h")]
    with caplog.at_level("WARNING", logger="agent_system.trainer.config"):
        config = compose_config(argv)
        validate_config(config)
    assert not [record for record in caplog.records if "deprecated" in record.getMessage()]
    plan = build_plan(config, TRAIN_ROWS[script.split("/")[0]], 500)
    betas = [(stage.stage_id, stage.beta_turn1, stage.beta_turn2, stage.beta_turn3) for stage in plan.stages]
    assert betas == PLAN_BETAS[script]
