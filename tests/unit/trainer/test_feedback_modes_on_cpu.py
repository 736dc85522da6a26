"""``mlmt.feedback``: the baselines' modes of the one trainer (single-turn GRPO, SCoRe) — config checks, the episode
shapes, the single-turn advantages and the metrics (no Ray; the episode runs on two tiny HF models in-process)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from config_copies import copier
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from agent_system.config import ConfigError, compose_config, has_hl
from agent_system.cpu_backend.hf_server import HFRolloutServer
from agent_system.launcher.main import check_config
from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings
from agent_system.multi_turn_rollout.stopping import stop_tokens
from agent_system.prompts.templates import PromptBuilder, Task
from agent_system.trainer import advantages as adv
from agent_system.trainer.advantages import Stage
from agent_system.trainer.metrics import episode_metrics, trajectory_records
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores


@pytest.fixture(scope="module")
def base():
    return copier(compose_config(["hl.model.path=/models/hl"]))


def _with(copy_of, **mlmt):
    cfg = copy_of()
    for key, value in mlmt.items():
        OmegaConf.update(cfg, f"mlmt.{key}", value)
    return cfg


def test_modes_validate_and_drop_the_hl(base):
    for mode in ("model", "self", "none"):
        check_config(_with(base, feedback=mode))
    assert has_hl(base()) and not has_hl(_with(base, feedback="self"))
    with pytest.raises(ConfigError, match="mlmt.feedback='critic'"):
        check_config(_with(base, feedback="critic"))


@pytest.mark.parametrize(
    ("mode", "knobs", "named"),
    [
        ("self", {"reward.hl_reward": "contrastive"}, "mlmt.reward.hl_reward"),
        ("self", {"reward.confidence_lambda": 0.1}, "mlmt.reward.confidence_lambda"),
        ("none", {"stages.beta_turn2": [0.1]}, "mlmt.stages.beta_turn2"),
        ("none", {"stages.stage_ids": [1]}, "mlmt.stages.stage_ids=1"),
        ("none", {"stages.alpha": [1.0]}, "mlmt.stages.alpha"),
        ("self", {"ll.freeze": True}, "mlmt.ll.freeze"),
    ],
)
def test_knobs_that_need_an_hl_or_a_turn_3_are_rejected(base, mode, knobs, named):
    with pytest.raises(ConfigError, match=named):
        check_config(_with(base, feedback=mode, **knobs))


def test_score_stages_are_valid_without_an_hl(base):
    score = {"stages.schedule": [0, 3], "stages.stage_ids": [1, 2], "stages.alpha": [0.0, 10.0]}
    score.update({"stages.beta_turn1": [0.1, 0.01], "stages.beta_turn2": [0.0, 0.0], "stages.beta_turn3": [0.0, 0.0]})
    check_config(_with(base, feedback="self", **score))


@pytest.fixture(scope="module")
def runner(tiny_models):
    policies, tokenizers = {}, {}
    for level, path in tiny_models.items():
        tokenizer = AutoTokenizer.from_pretrained(path)
        eos, pad = stop_tokens(path, tokenizer)
        server = HFRolloutServer(path, "float32", eos, pad, 1024, 64, {"max_batch_size": 8})
        policies[level], tokenizers[level] = _Local(server), tokenizer
    return EpisodeRunner(policies["ll"], policies["hl"], tokenizers["ll"], tokenizers["hl"], PromptBuilder({}, 64))


class _Local:
    def __init__(self, server):
        self.server = server

    async def generate(self, prompt_ids, max_tokens, temperature, request_id):
        return await self.server.generate(
            prompt_ids, {"temperature": temperature, "max_tokens": max_tokens}, request_id
        )


def _settings(feedback):
    return EpisodeSettings(2, 2, 6, 5, 1024, 1.0, 1.0, feedback=feedback)


def test_episode_shapes_per_mode(runner):
    problems = [Task("What is 1 + 2?", "math", "3"), Task("What is 2 + 2?", "math", "4")]

    async def all_modes():  # one loop: the HF server's batcher binds to the loop that first uses it
        return [await runner.run(problems, _settings(mode), mode) for mode in ("model", "self", "none")]

    full, score, single = asyncio.run(all_modes())
    assert all(r.feedback is not None for e in full for a in e.attempts for r in a.refinements)
    refinements = [r for e in score for a in e.attempts for r in a.refinements]
    assert len(refinements) == 2 * 2 * 2 and all(r.feedback is None for r in refinements)
    # the second attempt reads the fixed self-correction instruction, not a feedback
    prompt = refinements[0].refinement.prompt.text
    assert "Check your attempt" in prompt and "Feedback from a tutor" not in prompt
    assert all(not a.refinements for e in single for a in e.attempts)

    scores = StepScores(r1=np.array([[1.0, 0.0], [0.0, 0.0]]), r3=np.zeros((2, 2, 0)))
    metrics = episode_metrics(single, scores, prefix="train")
    assert metrics["train/acc@t1"] == 0.25 and "train/acc@t3" not in metrics
    assert "train/hl_feedback_length" not in metrics
    records = trajectory_records([{"reward_model": {"ground_truth": "3"}}] * 2, single, scores)
    assert len(records) == 4 and records[0]["R1"] == 1.0 and "feedback" not in records[0]
    score_scores = StepScores(r1=np.zeros((2, 2)), r3=np.ones((2, 2, 2)))
    metrics = episode_metrics(score, score_scores, prefix="train")
    assert metrics["train/acc@t3"] == 1.0 and metrics["train/delta_i2c"] == 1.0
    assert "train/hl_feedback_length" not in metrics


def test_single_turn_rows_get_grpo_advantages_of_r1():
    rows = {"problem": [0, 0, 0, 0], "attempt": [0, 1, 2, 3], "feedback": [0, 0, 0, 0], "turn": [1, 1, 1, 1]}
    scores = StepScores(r1=np.array([[1.0, 0.0, 0.0, 1.0]]), r3=np.zeros((1, 4, 0)))
    mlmt = OmegaConf.create({"ll": {"adv_estimator": "grpo", "turn3_group_by": "problem"}, "stages": {"kl_in": "loss"}})
    algorithm = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True})
    stage = Stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=0.0)
    result = adv.level_advantages(
        level="ll",
        rows=RowKeys(**rows),
        scores=scores,
        stage=stage,
        mlmt=mlmt,
        algorithm=algorithm,
        inputs=LevelInputs(kl=np.zeros(4), response_mask=torch.ones(4, 3)),
    )
    per_row = result.advantages[:, 0].numpy()
    assert np.allclose(per_row, [0.866, -0.866, -0.866, 0.866], atol=1e-3)  # ±1/√(4/3): unbiased std of [1,0,0,1]
    assert list(result.task_rewards) == [1.0, 0.0, 0.0, 1.0]
