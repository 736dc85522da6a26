"""Held-out data: prepare_all.sh writes every file the scripts read by default, each script's validation set is
disjoint (by id and by normalised problem text) from its training and evaluation sets, and test-split training rows
are refused.

prepare_all.sh runs once for the module on the real benchmark data (../shared/data; MLMT_SHARED_DATA overrides), about
12 s. Every run script is run through bash with a stub interpreter that records the overrides it would pass to the
trainer (the last value of a key wins, as in Hydra).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from shared_data import shared_data

from agent_system.data import eval_sets
from agent_system.data.heldout import (
    VAL_IS_EVAL,
    ProblemSet,
    TrainOnTestSplitError,
    check_train_splits,
    overlap,
    validation_warnings,
)
from agent_system.data.prepare import eval_sets_json, local_inputs

pytestmark = pytest.mark.external  # runs prepare_all.sh on ../shared/data

REPO = Path(__file__).resolve().parents[3]

# every training script under mlmt-configs/ and recipes/ (custom_yaml writes its own data) -> its evaluation file
SCRIPTS = {
    **{f"mlmt-configs/math/{p.name}": "math500/test.parquet" for p in (REPO / "mlmt-configs/math").glob("HL*.sh")},
    "mlmt-configs/code/HLT_LLT_RR_mbpp.sh": "mbpp/test.parquet",
    "recipes/grpo/run_grpo.sh": "math500/test.parquet",
    "recipes/score/run_score.sh": "math500/test.parquet",
    "recipes/rl_guided_score/run_rl_guided_score.sh": "math500/test.parquet",
    "recipes/value_shaping/run_value_shaping.sh": "math500/test.parquet",
    "recipes/archer/run_archer.sh": "math500/test.parquet",
    "recipes/archer/run_archer.sh TASK=code": "mbpp/test.parquet",
    "recipes/reinforce_kl/run_reinforce_kl.sh": "gsm8k_5shot/test.parquet",
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "data"
    result = subprocess.run(
        ["bash", str(REPO / "examples/data_preprocess/prepare_all.sh"), str(shared_data()), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _data_files(script: str, data_dir: Path, tmp_path: Path) -> tuple[str, str]:
    """The (train, val) files the script passes to the trainer with DATA_DIR=data_dir."""
    path, *env_words = script.split()
    record, stub = tmp_path / "argv", tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    env = {**os.environ, **dict(w.split("=", 1) for w in env_words), "DATA_DIR": str(data_dir)}
    env.update(MLMT_PYTHON=str(stub), ARGV_RECORD=str(record))
    result = subprocess.run(["bash", str(REPO / path)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    overrides = dict(o.split("=", 1) for o in record.read_text().split("\0")[:-1][2:] if "=" in o)  # the last wins
    return overrides["data.train_files"], overrides["data.val_files"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_default_file_exists_and_validation_is_held_out(script, prepared, tmp_path):
    train_file, val_file = _data_files(script, prepared, tmp_path)
    eval_file = prepared / SCRIPTS[script]
    for path in (train_file, val_file, eval_file):
        assert Path(path).is_file(), (script, path)
    train, val, evaluation = (pd.read_parquet(p) for p in (train_file, val_file, eval_file))
    assert len(val) >= 90, (script, len(val))
    for name, other in (("train", train), ("evaluation", evaluation)):
        found = overlap(val, ProblemSet.of_frame(name, other))
        assert (found.by_id, found.by_text) == (0, 0), (script, name, found)
    assert validation_warnings(val, train) == []  # nor in any known evaluation set (MATH-500, GSM8K / MBPP test)
    assert check_train_splits(train_file) == {}
    assert {e["split"] for e in val.extra_info} == {"validation"}


def test_prepared_splits(prepared):
    """MATH val: 500 MATH test problems none of MATH-500; GSM8K val removed from train; MBPP val = task_ids 511-600."""
    math_val = pd.read_parquet(prepared / "math/val.parquet")
    assert len(math_val) == 500
    assert {e["source_split"] for e in math_val.extra_info} == {"test"}
    assert not {e["unique_id"] for e in math_val.extra_info} & eval_sets.MATH500_UNIQUE_IDS
    gsm_train, gsm_val = (pd.read_parquet(prepared / f"gsm8k/{n}.parquet") for n in ("train", "val"))
    assert (len(gsm_train), len(gsm_val)) == (7473 - 500, 500)
    mbpp = {n: pd.read_parquet(prepared / f"mbpp/{n}.parquet") for n in ("train", "val", "test")}
    ids = {n: sorted(e["task_id"] for e in frame.extra_info) for n, frame in mbpp.items()}
    constant_answer = {667, 674, 816, 899}  # train tasks a constant passes: left out (data.constant_answer)
    train = [task for task in range(601, 975) if task not in constant_answer]
    assert ids == {"train": train, "val": list(range(511, 601)), "test": list(range(11, 511))}
    shots = pd.read_parquet(prepared / "gsm8k_5shot/train.parquet").head(200)  # the examples come from train only
    val_questions = {e["question"].strip() for e in gsm_val.extra_info}
    shown = {part.split("\nSolution:")[0] for p in shots.prompt for part in p[0]["content"].split("Question: ")[1:]}
    assert len(shown) > 200 and not shown & val_questions


def test_validation_on_the_evaluation_set_is_named(prepared):
    math500 = pd.read_parquet(prepared / "math500/test.parquet")
    train = pd.read_parquet(prepared / "math/train.parquet")
    [message] = validation_warnings(math500, train)
    assert message.startswith(VAL_IS_EVAL)
    assert "500 of 500 rows are in MATH-500: 500 by id, 500 by problem text" in message
    # text alone: the GSM8K test set without ids, re-spaced and re-cased, is still found
    gsm_test = pd.read_parquet(prepared / "gsm8k/test.parquet").head(20)
    gsm_test["extra_info"] = [{**e, "question": "  " + e["question"].upper()} for e in gsm_test.extra_info]
    [message] = validation_warnings(gsm_test, None)
    assert "20 of 20 rows are in GSM8K test: 0 by id, 20 by problem text" in message
    # an evaluation file named by the caller
    val = pd.read_parquet(prepared / "math/val.parquet")
    [message] = validation_warnings(val.head(7), None, [str(prepared / "math/test.parquet")])
    assert f"7 of 7 rows are in {prepared / 'math/test.parquet'}" in message
    # training rows in validation
    [message] = validation_warnings(train.head(3), train)
    assert message.startswith("validation set overlaps the training set: 3 of 3")


def test_test_split_rows_are_refused_by_file_and_count(prepared):
    mixed, test = str(prepared / "mbpp/mbpp.parquet"), str(prepared / "math500/test.parquet")
    with pytest.raises(TrainOnTestSplitError) as error:
        check_train_splits([str(prepared / "math/train.parquet"), mixed, test])
    message = str(error.value)
    assert f"{mixed}: 500 of its rows" in message and f"{test}: 500 of its rows" in message
    assert "data.allow_test_split_in_train=true" in message and "math/train.parquet" not in message
    assert check_train_splits(mixed, allow=True) == {mixed: 500}


def test_preflight_refuses_test_split_training_rows_before_ray(prepared, tmp_path):
    """The entry point's first step (``main.preflight``, before Ray and any worker) makes the check, plan_only too."""
    from agent_system.config import compose_config
    from agent_system.launcher.main import preflight

    test = str(prepared / "math500/test.parquet")
    config = compose_config([f"data.train_files={test}", f"trainer.default_local_dir={tmp_path / 'run'}"])
    with pytest.raises(TrainOnTestSplitError, match="500 of its rows"):
        preflight(config)
    assert not (tmp_path / "run" / "run_plan.json").exists()


def test_the_embedded_evaluation_sets_are_the_data():
    assert eval_sets.EVAL_SETS_FILE.read_text() == eval_sets_json(local_inputs(str(shared_data())))
    assert (len(eval_sets.MATH500_UNIQUE_IDS), len(eval_sets.MATH500_TEXT)) == (500, 500)
    assert len(eval_sets.GSM8K_TEST_TEXT) == 1319 and len(eval_sets.MBPP_TEST_TEXT) == 499  # two tasks share a text
