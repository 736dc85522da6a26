"""RL-guided SCoRe's direction: one update of the guidance model (the HL) with a real verl actor makes the feedbacks
that led to a correct second attempt likelier, and the others not.

The e2e recipe test (tests/e2e/test_recipes_on_cpu.py) only shows the guidance model moving away from its reference,
which a negated advantage does too. Here the HL rows go through the trainer's own path, ``MLMTTrainer.
build_level_batch`` (log-probs, reference log-probs, ``level_advantages``) and ``update_level`` (verl's actor with the
recipe's KL loss to the reference), under the recipe's settings (hl_reward=r3, REINFORCE, the SCoRe stages). One
problem, n = 2 attempts, m = 2 feedbacks each, fixed token ids; R3 = 1 for feedbacks (0, 0) and (1, 1), 0 for the
others. Independent expectation: REINFORCE on R3 gives every response token of a feedback its R3 (+1 or 0), and the
gradient step raises the log-probability of the +1 feedbacks; the 0 feedbacks get no task gradient (only the shared
weights move them). A negated advantage anywhere on the path (the HL score, the estimator, the batch, the loss)
lowers the rewarded feedbacks instead.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.integration

# R3 of each feedback (attempt, feedback): the second attempt after feedbacks (0, 0) and (1, 1) is correct
R3 = np.array([[[1.0, 0.0], [0.0, 1.0]]])
REWARDED = [0, 3]  # HL rows in (attempt, feedback) order: (0, 0) (0, 1) (1, 0) (1, 1)
UNREWARDED = [1, 2]


def _turn(generator, prompt_len: int, response_len: int):
    from agent_system.multi_turn_rollout.episode import Turn
    from agent_system.prompts.templates import Prompt

    prompt = torch.randint(3, 200, (prompt_len,), generator=generator).tolist()
    response = torch.randint(3, 200, (response_len,), generator=generator).tolist()
    return Turn(Prompt("", prompt), response, [0.0] * response_len, "", False)


def _episodes():
    from agent_system.multi_turn_rollout.episode import Attempt, Episode, Refinement
    from agent_system.prompts.templates import Task

    generator = torch.Generator().manual_seed(0)
    attempts = [
        Attempt(
            _turn(generator, 6, 6),
            [Refinement(_turn(generator, 8, 6), _turn(generator, 8, 6)) for _ in range(2)],
        )
        for _ in range(2)
    ]
    return [Episode(0, Task("What is 1 + 2?", "math", "3"), attempts)]


def _row_log_probs(group, batch) -> np.ndarray:
    """Sum of each HL row's response-token log-probs under the actor's current weights."""
    log_probs, _ = group.compute_log_prob(batch)
    return (log_probs * batch.batch["response_mask"]).sum(-1).numpy()


def test_guidance_update_raises_the_feedbacks_that_led_to_a_correct_refinement(tiny_models, ray_per_test):
    from transformers import AutoTokenizer

    from agent_system.config import compose_config
    from agent_system.levels.placement import build_workers
    from agent_system.trainer import advantages as adv
    from agent_system.trainer.mlmt_trainer import MLMTTrainer
    from agent_system.trainer.rows import StepScores

    config = compose_config(
        [
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            "data.train_batch_size=1",
            "data.max_prompt_length=16",
            "data.max_response_length=8",
            "hl.rollout.response_length=8",
            "mlmt.n=2",
            "mlmt.m=2",
            # recipes/rl_guided_score/run_rl_guided_score.sh (its RR, SCoRe stages and guidance-model keys)
            "mlmt.reward.hl_reward=r3",
            "mlmt.ll.adv_estimator=reinforce",
            "mlmt.hl.adv_estimator=reinforce",
            "mlmt.stages.schedule=[0,2]",
            "mlmt.stages.stage_ids=[1,2]",
            "mlmt.stages.beta_turn1=[0.1,0.01]",
            "mlmt.stages.beta_turn2=[0.0,0.0]",
            "mlmt.stages.beta_turn3=[0.01,0.01]",
            "mlmt.stages.alpha=[0.0,10.0]",
            "hl.actor.use_kl_loss=true",
            "hl.actor.kl_loss_coef=0.05",
            "hl.actor.kl_loss_type=low_var_kl",
            "hl.actor.optim.lr=1e-3",
            "hl.actor.ppo_mini_batch_size=4",
        ]
    )
    groups, _ = build_workers(config, use_ref={"ll": False, "hl": True})
    group = groups["hl"]
    group.init()
    trainer = object.__new__(MLMTTrainer)
    trainer.config, trainer.mlmt = config, config.mlmt
    trainer.groups, trainer.critics, trainer.extensions = {"hl": group}, {}, []
    trainer.tokenizers = {"hl": AutoTokenizer.from_pretrained(tiny_models["hl"])}
    episodes = _episodes()
    scores = StepScores(r1=np.zeros((1, 2)), r3=R3)

    for step in (1, 2):  # stage I and stage II: the guidance model's reward is R3 in both
        _, stage = adv.stage_at(config.mlmt.stages, step)
        built = trainer.build_level_batch("hl", None, episodes, scores, stage)
        batch = built.data
        mask = batch.batch["response_mask"].float()
        expected = torch.as_tensor(R3.reshape(-1), dtype=torch.float32)[:, None] * mask  # REINFORCE: R3 per token
        torch.testing.assert_close(batch.batch["advantages"].float() * mask, expected)
        before = _row_log_probs(group, batch)
        metrics = trainer.update_level(built)
        after = _row_log_probs(group, batch)
        change = after - before
        print(f"step {step}: change of each feedback's log-prob", np.round(change, 4), "R3", R3.reshape(-1))
        assert "hl/pg_loss" in metrics
        assert all(change[i] > 0 for i in REWARDED), change
        assert min(change[REWARDED]) > max(change[UNREWARDED]), change
