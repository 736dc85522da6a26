"""Bi-level value shaping (recipes/value_shaping) through ``python -m verl.trainer.main_mlmt`` with tiny models.

Two runs, ``mlmt.value_shaping.value_grad=stop`` and ``=full``, 2 steps each (hf rollout servers at both levels, the
symmetric reward R ∈ {−1, +1}; 12 solver rows, more than one critic mini-batch of 6, so each critic update takes
two optimizer steps, each with its own full-grad term, whose scale is unit-tested in
tests/unit/methods/test_value_shaping_shaping_on_cpu.py), made reproducible across runs: greedy decoding (``top_k=1`` at
temperature 1, accepted on trained levels with ``mlmt.allow_truncated_sampling=true``: the log-probs stay those of
the full distribution at temperature 1, which the full-grad term's weights need, where a temperature near 0 makes them
all 0; the hf server's sampling depends on how concurrent requests are batched) and a critic checkpoint with a saved
value head (verl would initialise a missing one from an unseeded RNG). The variants differ where they should and only
there:

* step 1: the same episodes, the same V (the critic's pre-update weights), so the same solver and HL advantages;
  the critic's extra loss term (the HL objective's gradient into V) is 0 with stop-grad and non-zero with
  full-grad (the logged MSE, a mean over the two critic steps, differs from the second step on: the first step's
  gradients differ; the equal MSE part of the two losses is unit-tested);
* step 2: the policies got the same updates, so the same episodes again, but the critics were trained with
  different losses: V(x, z, g), hence the HL's shaped reward, differs.

In each run the solver's advantages are R − V(prompt) (token means: advantage = return − V) and the HL's reward
is R3 + c·V(x, z, g).
"""

from __future__ import annotations

import pytest
from mlmt_run import run_main, trajectories

pytestmark = pytest.mark.e2e

COEF = 5.0  # c: the full-grad term (centred, per-token: about the value loss in size) is c times it
SAME_EPISODES = ("train/acc@t1", "train/acc@t3", "train/generated_tokens", "train/hl_feedback_length")


@pytest.fixture
def critic_path(tiny_models, tmp_path):
    """The solver's tiny model with a seeded value head (num_labels = 1), saved: the same V in both runs."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    out = tmp_path / "critic"
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(tiny_models["ll"], num_labels=1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_models["ll"]).save_pretrained(out)
    return out


def _run(tiny_models, critic_path, tmp_path, value_grad: str) -> dict[int, dict[str, float]]:
    return run_main(
        tmp_path / value_grad,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "data.max_response_length=8",
            "hl.rollout.response_length=6",
            "mlmt.n=2",
            "mlmt.m=2",
            "mlmt.dataset.n_train=16",
            "mlmt.dataset.n_val=2",
            "mlmt.reward.num_workers=1",
            "mlmt.ll.adv_estimator=value_baseline",
            "mlmt.hl.adv_estimator=reinforce",
            "mlmt.reward.hl_reward=value_shaped",
            f"mlmt.value_shaping.value_coef={COEF}",
            f"mlmt.value_shaping.value_grad={value_grad}",
            "mlmt.value_shaping.symmetric_reward=true",
            f"critic.model.path={critic_path}",
            "critic.optim.lr=1e-2",
            "critic.ppo_mini_batch_size=6",  # 12 solver rows: two critic steps per update (issue 16, item 4)
            "actor_rollout_ref.rollout.top_k=1",
            "hl.rollout.top_k=1",
            "mlmt.allow_truncated_sampling=true",  # off-policy by design here: sampling greedy, log-probs at T = 1
        ],
        timeout=600,
    )


@pytest.mark.extended
@pytest.mark.slow(seconds=180)
def test_stop_and_full_grad_differ_only_in_the_critic(tiny_models, critic_path, tmp_path):
    runs = {grad: _run(tiny_models, critic_path, tmp_path, grad) for grad in ("stop", "full")}
    for step in (1, 2):  # the same episodes in both runs
        assert trajectories(tmp_path / "stop", step) == trajectories(tmp_path / "full", step), step
    for grad, metrics in runs.items():
        for step in (1, 2):
            m = metrics[step]
            # the solver: R − V(prompt) on every token
            assert m["ll/advantage_mean"] == pytest.approx(m["ll/return_mean"] - m["ll/value_baseline_mean"], abs=1e-5)
            assert m["ll/value_baseline_mean"] != 0.0
            # the HL: R + c·V(x, z, g) with the symmetric R = 2·R3 − 1 (reinforce: advantage = reward on each token)
            shaped = 2 * m["train/acc@t3"] - 1 + COEF * m["hl/feedback_value_mean"]
            assert m["hl/reward_mean"] == pytest.approx(shaped, abs=1e-5), (grad, step)
            extra = m["ll/critic/hl_value_grad_loss"]
            assert extra == 0.0 if grad == "stop" else extra != 0.0, (grad, step, extra)
    stop, full = runs["stop"], runs["full"]
    same_at_step_1 = (
        *SAME_EPISODES,
        "ll/advantage_mean",
        "ll/value_baseline_mean",
        "hl/advantage_mean",
        "hl/reward_mean",
        "hl/feedback_value_mean",
    )
    for key in same_at_step_1:
        assert stop[1][key] == pytest.approx(full[1][key], abs=1e-6), key
    for key in SAME_EPISODES:  # the policies' updates were the same
        assert stop[2][key] == pytest.approx(full[2][key], abs=1e-6), key
    # the critics were not: V(x, z, g) differs at step 2, and with it the HL's reward (R + c·V, checked above per
    # run). The full-grad term is centred over the step's feedbacks, so it moves the spread of V more than its mean.
    moved = {s: abs(stop[2][f"hl/feedback_value_{s}"] - full[2][f"hl/feedback_value_{s}"]) for s in ("min", "max")}
    assert max(moved.values()) > 1e-4, moved
    difference = stop[2]["hl/reward_mean"] - full[2]["hl/reward_mean"]
    value_difference = stop[2]["hl/feedback_value_mean"] - full[2]["hl/feedback_value_mean"]
    assert difference == pytest.approx(COEF * value_difference, abs=1e-6) and difference != 0.0
