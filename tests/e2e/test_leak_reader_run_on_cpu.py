"""The reader test in a run (``mlmt.reward.leak_reader=true``, docs/LEAK.md "The reader test"): through
``python -m verl.trainer.main_mlmt`` with real verl workers, the LL's reference worker scores every math feedback of
the step (``train/leak_reader_read`` equals the feedbacks the leak check read), and each trajectory record carries
its gain. The gains' values and the verdict are tested in tests/unit/rewards/test_leak_reader_on_cpu.py."""

from __future__ import annotations

import math

import pytest
from mlmt_run import run_main, trajectories

from agent_system.demos.toy_run import HF_TOY_RUN

pytestmark = pytest.mark.e2e


def test_the_reference_worker_reads_every_feedback_of_the_step(tiny_models, tmp_path):
    out = tmp_path / "run"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            "trainer.total_training_steps=1",
            "data.train_batch_size=2",
            "mlmt.stages.beta_turn1=[0.01]",  # the LL's reference model, which the reader scores with
            "mlmt.reward.leak_reader=true",
            "data.max_response_length=16",
            "hl.rollout.response_length=16",
            *HF_TOY_RUN,
        ],
    )
    step = metrics[1]
    assert step["train/leak_checked"] > 0
    assert step["train/leak_reader_read"] == step["train/leak_checked"], step
    assert math.isfinite(step["train/leak_reader_gain_mean"])
    gains = [record["leak_reader_gain"] for record in trajectories(out, 1)]
    assert len(gains) == step["train/leak_checked"] and all(math.isfinite(g) for g in gains), gains
