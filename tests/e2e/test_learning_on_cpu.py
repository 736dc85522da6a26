"""Learning on a toy task (issue 3): rewards rise for the solver and the feedback writer's updates reach its server.

Toy task: one easy problem ("What is 1 + 2?"), repeated. The tiny random-init solver answers 3 by chance in a few
percent of its samples (the arith grader takes the last number of a response), so GRPO has a signal from the first
steps. 8 steps with n = 16 attempts ((tH, tL) = (1, 3): 6 LL and 2 HL updates) take the solver's turn-1
accuracy from about 0.03 at step 1 (the initial weights) to well above 0.5 (measured: 0.30 mean over steps 1-4 and
0.99 over steps 9-12 in a 12-step run; learning starts at step 2, so only step 1 measures the initial rate). The
servers' batching makes sampling order-dependent, so the assertion keeps a wide margin: steps 6-8 > step 1 + 0.25.
The test fails if the gradient sign, the advantage grouping or the weight sync is wrong: with a wrong sign or
grouping accuracy does not rise; with a broken sync the servers keep sampling from the initial weights (no rise), and
the actor/rollout log-prob gap on the sampled tokens exposes it directly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

pytestmark = pytest.mark.e2e

PROBLEM, ANSWER = "What is 1 + 2?", "3"


def _rows(count: int, split: str) -> list[dict]:
    return [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": PROBLEM}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ANSWER},
            "extra_info": {"index": i, "split": split, "reference_solution": "1 + 2 = 3. \\boxed{3}"},
        }
        for i in range(count)
    ]


def _metric(log: str, step: int, key: str) -> float:
    line = re.search(rf"^step:{step} .*$", log, re.M).group(0)
    return float(re.search(rf"{re.escape(key)}:([-0-9.e]+)", line).group(1))


def test_solver_reward_rises_and_feedback_writer_changes(tiny_models, tmp_path):
    pd.DataFrame(_rows(32, "train")).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame(_rows(4, "val")).to_parquet(tmp_path / "val.parquet")
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_mlmt",
        f"actor_rollout_ref.model.path={tiny_models['ll']}",
        f"hl.model.path={tiny_models['hl']}",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"data.val_files={tmp_path / 'val.parquet'}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console]",
        "trainer.total_training_steps=8",
        "trainer.save_freq=8",
        "trainer.test_freq=8",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "hl.rollout.response_length=6",
        "mlmt.n=16",
        "mlmt.m=2",
        "mlmt.schedule.tH=1",
        "mlmt.schedule.tL=3",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "hl.actor.optim.lr=1e-2",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]

    early = _metric(log, 1, "train/acc@t1")
    late = sum(_metric(log, s, "train/acc@t1") for s in (6, 7, 8)) / 3
    print(f"turn-1 accuracy: step 1 {early:.3f}, steps 6-8 {late:.3f}")
    assert early < 0.2 and late > early + 0.25, (early, late)

    # Every update after a level's first sync scores tokens its server sampled with the synced weights.
    for step, level in ((5, "ll"), (7, "ll"), (8, "hl")):
        assert _metric(log, step, f"{level}/rollout_actor_logprob_diff_max") < 1e-3, (step, level)
    # The HL was trained: its exported weights differ from the initial model.
    from transformers import AutoModelForCausalLM

    from agent_system.trainer.export import export_checkpoint

    exported = export_checkpoint(str(out))
    trained = AutoModelForCausalLM.from_pretrained(exported["hl"]).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_models["hl"]).state_dict()
    assert max((trained[k] - initial[k]).abs().max().item() for k in initial) > 1e-3
