"""The feedback-leak metric and ``mlmt.reward.leak_penalty`` in a real run (``python -m verl.trainer.main_mlmt``).

On the cue task (cue_task.py: ground truth 3, an untrained tiny feedback writer emitting random tokens, some of them
digits), every feedback of every step is checked by the RewardPool: the step's ``train/leak_rate`` and
``train/leak_checked`` are logged, each trajectory record carries ``leak``, and the logged HL reward is exactly
R3 − penalty on the leaking feedbacks (the mean over all of the step's records, which hold every feedback). In the
measured run no feedback leaked (0 of 64: 4-token random feedbacks rarely end in "3"), so the run checks that the
penalty touches no other row; that it lowers exactly the leaking rows' HL reward is
tests/unit/rewards/test_leak_on_cpu.py (the trainer's own scoring and HL batch on hand-written feedbacks).
"""

from __future__ import annotations

import numpy as np
import pytest
from mlmt_run import run_main, trajectories

from agent_system.rewards.leak import candidate_answers

pytestmark = pytest.mark.e2e
PENALTY = 0.5


def test_leak_rate_logged_and_the_penalty_in_the_hl_reward(cue_ll_unsure, cue_hl, cue_data, tmp_path):
    out = tmp_path / "run"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={cue_ll_unsure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            "data.max_response_length=6",
            "hl.rollout.response_length=4",
            "data.train_batch_size=4",
            "mlmt.n=2",
            "mlmt.m=4",
            "trainer.total_training_steps=2",
            "mlmt.reward.num_workers=1",
            f"mlmt.reward.leak_penalty={PENALTY}",
            "mlmt.trajectories_per_step=1000",
            "trainer.val_before_train=true",
            "trainer.save_freq=-1",
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
        ],
    )
    leaked = 0
    for step in (1, 2):
        records = trajectories(out, step)
        assert len(records) == 4 * 2 * 4 and metrics[step]["train/leak_checked"] == len(records)
        leaks = np.array([r["leak"] for r in records], dtype=float)
        assert metrics[step]["train/leak_rate"] == pytest.approx(leaks.mean())
        r3 = np.array([r["R3"] for r in records])
        assert metrics[step]["hl/reward_mean"] == pytest.approx((r3 - PENALTY * leaks).mean(), abs=1e-6)
        for record in records:  # a leak is a feedback with a candidate answer (the grader said which is 3)
            assert not record["leak"] or candidate_answers(record["feedback"], record["problem"])
        leaked += int(leaks.sum())
    assert "val/leak_rate" in metrics[2] and "val/leak_checked" in metrics[2]
    print(f"leaking feedbacks over the two steps: {leaked} of {2 * 32}")
