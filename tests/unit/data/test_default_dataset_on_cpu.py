"""The embedded arithmetic dataset: deterministic, idempotent, valid, and solvable by its references."""

import os

import pandas as pd

from agent_system.data.default_dataset import ensure_default_dataset, generate_rows, main
from agent_system.data.schema import validate_row
from agent_system.rewards import compute_score


def test_deterministic_and_disjoint():
    train_a, val_a = generate_rows(200, 40, seed=3)
    train_b, val_b = generate_rows(200, 40, seed=3)
    assert train_a == train_b and val_a == val_b
    assert generate_rows(200, 40, seed=4)[0] != train_a
    val_questions = {r["prompt"][0]["content"] for r in val_a}
    assert len(val_questions) == 40
    assert not val_questions & {r["prompt"][0]["content"] for r in train_a}
    assert {r["extra_info"]["difficulty"] for r in train_a} == {1, 2, 3}


def test_files_valid_idempotent_and_references_score_one(tmp_path):
    train_path, val_path = ensure_default_dataset(str(tmp_path), n_train=64, n_val=16, seed=0)
    assert "seed0" in train_path and "ntrain64" in train_path and val_path.endswith("_val.parquet")
    mtime = os.path.getmtime(train_path)
    assert ensure_default_dataset(str(tmp_path), n_train=64, n_val=16, seed=0) == (train_path, val_path)
    assert os.path.getmtime(train_path) == mtime  # reused, not rewritten
    assert ensure_default_dataset(str(tmp_path), n_train=32, n_val=16, seed=0)[0] != train_path
    for path, count, split in ((train_path, 64, "train"), (val_path, 16, "val")):
        frame = pd.read_parquet(path)
        assert len(frame) == count
        for row in frame.to_dict(orient="records"):
            row["prompt"] = list(row["prompt"])
            validate_row(row)
            assert row["data_source"] == "arith" and row["extra_info"]["split"] == split
            solution = row["extra_info"]["reference_solution"]
            assert solution.endswith("}$.") and "\\boxed{" in solution
            assert compute_score("arith", solution, row["reward_model"]["ground_truth"])["acc"]


def test_cli(tmp_path):
    main(["--out-dir", str(tmp_path), "--n-train", "8", "--n-val", "4", "--seed", "1"])
    assert sorted(os.listdir(tmp_path)) == [
        "arith_v2_seed1_ntrain8_nval4_difficulty3_train.parquet",
        "arith_v2_seed1_ntrain8_nval4_difficulty3_val.parquet",
    ]


def test_max_difficulty_keeps_the_easy_problems_and_names_the_files(tmp_path):
    easy, _ = generate_rows(100, 8, seed=0, max_difficulty=1)
    assert {row["extra_info"]["difficulty"] for row in easy} == {1}
    full, _ = generate_rows(100, 8, seed=0)
    assert {row["extra_info"]["difficulty"] for row in full} == {1, 2, 3}
    assert generate_rows(100, 8, seed=0, max_difficulty=3) == (full, _)  # the full mix is unchanged by the knob
    paths = ensure_default_dataset(str(tmp_path), 16, 4, 0, max_difficulty=1)
    assert "difficulty1" in paths[0] and paths != ensure_default_dataset(str(tmp_path), 16, 4, 0)


def test_validation_rows_of_any_call_are_held_out_from_training_rows_of_any_other():
    """The validation questions never appear in a training set of another seed or size (they did: the CPU comparison
    evaluated on 16 problems of a 32-problem validation file, 8 of which the runs, holding out only 8, trained on)."""
    for difficulty in (1, 3):
        calls = [generate_rows(256, n_val, seed, difficulty) for seed in (0, 1) for n_val in (8, 32)]
        train = {r["prompt"][0]["content"] for rows, _ in calls for r in rows}
        val = {r["prompt"][0]["content"] for _, rows in calls for r in rows}
        assert len(val) >= 32 and not val & train, difficulty


def test_the_cpu_comparison_evaluates_held_out_problems(tmp_path):
    """recipes/README.md's comparison: the runs train on the embedded task (mlmt.dataset defaults), the table is
    evaluated on the first 16 problems of a 32-problem validation file of the same task; overlap measured by
    agent_system.comparisons.compare.training_overlap (id and normalised text)."""
    import argparse

    from agent_system.comparisons.compare import training_overlap

    _, val_path = ensure_default_dataset(str(tmp_path), n_train=256, n_val=32, seed=0, max_difficulty=1)
    args = argparse.Namespace(train=None, overrides=[], eval_data=val_path, limit=16)
    assert training_overlap(args) is None
    train_path, _ = ensure_default_dataset(str(tmp_path), n_train=256, n_val=8, seed=0, max_difficulty=1)
    args = argparse.Namespace(train=train_path, overrides=[], eval_data=train_path, limit=16)
    assert "16 of the 16 evaluated problems" in training_overlap(args)  # the measure finds training problems
