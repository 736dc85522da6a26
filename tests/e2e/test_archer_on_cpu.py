"""ArCHer (recipes/archer: ``mlmt.ll.adv_estimator=archer``) through `python -m verl.trainer.main_mlmt`, tiny model.

The multi-turn self-correction episode (``mlmt.feedback=self``): two solver utterances per episode, so the critic's
Q target of the first bootstraps from V_target(s2). Two steps of B = 2 problems × n = 2 attempts × m = 1 (8
transitions per step), 2 critic updates per step with the target refreshed every 3 updates. Checked: the critic
trained (its TD losses logged and finite, the buffer 8 → 16, 4 updates and 1 refresh), the LL's advantages are the
critic's signal (their mean |A| equals the critic's token-weighted |Q − V|, and is not 0 although the tiny random
solver earns almost no reward), PPO updated the solver, and the critic is saved in the checkpoint.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from mlmt_run import run_main, trajectories

pytestmark = pytest.mark.e2e


def _rows(count: int, split: str) -> list[dict]:
    return [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": "What is 1 + 2?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "3"},
            "extra_info": {"index": i, "split": split},
        }
        for i in range(count)
    ]


def test_archer_self_correction_trains_the_critic_and_the_solver(tiny_models, tmp_path):
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pd.DataFrame(_rows(8, "train")).to_parquet(train)
    pd.DataFrame(_rows(2, "val")).to_parquet(val)
    out = tmp_path / "archer"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "actor_rollout_ref.rollout.name=hf",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=2",
            "mlmt.reward.num_workers=1",
            "mlmt.feedback=self",
            "mlmt.ll.adv_estimator=archer",
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "data.max_response_length=8",
            "mlmt.n=2",
            "mlmt.m=1",
            "mlmt.archer.batch_size=4",
            "mlmt.archer.micro_batch_size=4",
            "mlmt.archer.updates_per_step=2",
            "mlmt.archer.target_refresh_every=3",
            "mlmt.archer.lr=1e-4",
        ],
    )
    for step in (1, 2):
        step_metrics = metrics[step]
        assert math.isfinite(step_metrics["archer/q_loss"]) and math.isfinite(step_metrics["archer/v_loss"])
        assert step_metrics["archer/transitions_added"] == 8  # 4 episodes × (turn 1 → s2, turn 3 → done)
        assert step_metrics["archer/signal_token_abs_mean"] > 0
        assert step_metrics["ll/advantage_abs_mean"] == pytest.approx(step_metrics["archer/signal_token_abs_mean"])
        assert "ll/pg_loss" in step_metrics and "train/acc@t3" in step_metrics
    assert [metrics[s]["archer/buffer_size"] for s in (1, 2)] == [8, 16]
    assert [metrics[s]["archer/updates"] for s in (1, 2)] == [2, 4]
    assert [metrics[s]["archer/target_refreshes"] for s in (1, 2)] == [0, 1]
    assert (out / "checkpoints" / "global_step_2" / "archer_critic" / "critic.pt").is_file()
    record = trajectories(out, 1)[0]
    assert record["feedback"] is None and record["refinement"] is not None
