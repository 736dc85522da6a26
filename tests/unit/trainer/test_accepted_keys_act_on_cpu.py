"""Keys that were accepted and did nothing (issue 41, point 6) are refused at start-up by name, and their neighbours
that act pass: the LL's ``rollout.response_length`` (it sized the server, not the budget) and both levels'
``rollout.prompt_length``, ``trainer.balance_batch=false`` (rows are always balanced), ``top_p`` / ``top_k`` on a
trained level (sampling unlike the trained log-probs), sub-keys of methods the config does not select, and
``mlmt.reward.leak_penalty`` on training rows the leak check does not read."""

from __future__ import annotations

import pandas as pd
import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.methods.leak_penalty import LeakPenalty

CONTRASTIVE = ["mlmt.reward.hl_reward=contrastive", "mlmt.hl.adv_estimator=reinforce"]

REJECTED = [
    # lengths: the server's context, not the trainer's budget (a plan with 16 accepted a server of 784 for rows of 832)
    (["actor_rollout_ref.rollout.response_length=16"], ["actor_rollout_ref.rollout.response_length=16",
                                                        "data.max_response_length=64", "unset it"]),
    (["actor_rollout_ref.rollout.prompt_length=512"], ["actor_rollout_ref.rollout.prompt_length=512",
                                                       "data.max_prompt_length=768"]),
    (["hl.rollout.prompt_length=512"], ["hl.rollout.prompt_length=512", "data.max_prompt_length"]),
    (["trainer.balance_batch=false"], ["trainer.balance_batch=False", "always balanced", "levels/balance.py"]),
    # truncated sampling on a level that updates: off-policy without a correction
    (["actor_rollout_ref.rollout.top_p=0.9"], ["actor_rollout_ref.rollout.top_p=0.9", "trained LL", "off-policy",
                                               "mlmt.ll.freeze=true", "mlmt.allow_truncated_sampling=true"]),
    (["actor_rollout_ref.rollout.top_k=20"], ["actor_rollout_ref.rollout.top_k=20"]),
    (["hl.rollout.top_k=1", "hl.rollout.top_p=0.5"], ["hl.rollout.top_k=1, hl.rollout.top_p=0.5", "trained HL"]),
    (["hl.rollout.top_k=1", "mlmt.ll.freeze=true"], ["hl.rollout.top_k=1"]),  # the HL still trains
    # sub-keys of methods the config does not select
    (["mlmt.reward.contrastive_lambda=1.0"], ["mlmt.reward.contrastive_lambda=1.0 (default 0.5)",
                                              "mlmt.reward.hl_reward=r3"]),
    (["mlmt.reward.contrastive_reference=no_feedback"], ["mlmt.reward.contrastive_reference='no_feedback'"]),
    (["mlmt.reward.hl_reward=progress", "mlmt.stages.alpha=[1.0]", "mlmt.hl.adv_estimator=reinforce",
      "mlmt.reward.contrastive_lambda=2.0"], ["mlmt.reward.contrastive_lambda=2.0", "hl_reward=progress"]),
    (["mlmt.reward.reg_gap=5"], ["mlmt.reward.reg_gap=5 (default 20)", "lagged LL snapshot"]),
    ([*CONTRASTIVE, "mlmt.reward.contrastive_reference=no_feedback", "mlmt.reward.reg_gap=5"],
     ["mlmt.reward.reg_gap=5", "contrastive_reference=no_feedback"]),
    (["mlmt.value_shaping.value_coef=0.5"], ["mlmt.value_shaping.value_coef=0.5 (default 0.1)",
                                             "acts only with mlmt.reward.hl_reward=value_shaped"]),
    (["mlmt.ll.adv_estimator=value_baseline", "mlmt.value_shaping.value_coef=0.5"],
     ["mlmt.value_shaping.value_coef=0.5"]),  # the baseline alone reads symmetric_reward only
    (["mlmt.archer.gamma=0.9"], ["mlmt.archer.gamma=0.9 (default 0.95)", "mlmt.ll.adv_estimator=grpo"]),
    (["mlmt.archer.critic_model_path=some/model", "mlmt.archer.lr=1e-4"], ["mlmt.archer.critic_model_path='some/model'",
                                                                         "mlmt.archer.lr=0.0001"]),
    (["mlmt.reward.confidence_clip=2.0"], ["mlmt.reward.confidence_clip=2.0", "confidence_lambda=0"]),
]  # fmt: skip

ACCEPTED = [
    ["actor_rollout_ref.rollout.response_length=64"],  # data.max_response_length's value (the CPU overlay's)
    ["data.max_response_length=128"],  # the server's context follows
    ["hl.rollout.response_length=16"],  # the HL's feedback budget
    ["trainer.balance_batch=true"],
    ["hl.rollout.top_k=1", "mlmt.hl.freeze=true"],  # a frozen level only samples
    ["actor_rollout_ref.rollout.top_p=0.9", "mlmt.ll.freeze=true"],
    ["hl.rollout.top_p=0.9", "mlmt.feedback=self"],  # no HL
    ["actor_rollout_ref.rollout.top_k=0", "hl.rollout.top_p=1.0"],  # no truncation
    ["actor_rollout_ref.rollout.top_k=1", "hl.rollout.top_k=1", "mlmt.allow_truncated_sampling=true"],  # said so
    [*CONTRASTIVE, "mlmt.reward.contrastive_lambda=1.0", "mlmt.reward.reg_gap=5"],  # the snapshot's period
    [*CONTRASTIVE, "mlmt.reward.contrastive_reference=no_feedback", "mlmt.hl.adv_estimator=reinforce"],
    ["mlmt.ll.adv_estimator=value_baseline", "mlmt.value_shaping.symmetric_reward=true"],
    ["mlmt.ll.adv_estimator=value_baseline", "mlmt.reward.hl_reward=value_shaped", "mlmt.hl.adv_estimator=reinforce",
     "mlmt.value_shaping.value_coef=0.5"],
    ["mlmt.ll.adv_estimator=archer", "mlmt.archer.gamma=0.9", "mlmt.archer.critic_model_path=some/model"],
    ["mlmt.reward.confidence_lambda=0.5", "mlmt.reward.confidence_clip=2.0"],
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "keys"), REJECTED)
def test_a_key_that_cannot_act_is_refused_by_name(overrides, keys):
    with pytest.raises(ConfigError) as error:
        check_config(compose_config(overrides))
    for key in keys:
        assert key in str(error.value), (key, str(error.value))


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_its_neighbour_that_acts_is_accepted(overrides):
    check_config(compose_config(overrides))


def _rows(*sources: str) -> pd.DataFrame:
    return pd.DataFrame({"data_source": list(sources), "prompt": [[{"role": "user", "content": "x"}]] * len(sources)})


@pytest.mark.parametrize("sources", [("mbpp",), ("yaml_task",), ("mbpp", "yaml_task")])
def test_leak_penalty_on_rows_without_a_math_task_is_refused(sources):
    with pytest.raises(ConfigError) as error:
        LeakPenalty(0.5).check_data(_rows(*sources), "train.parquet")
    message = str(error.value)
    assert "mlmt.reward.leak_penalty=0.5" in message and "data.train_files=train.parquet" in message, message
    assert all(f"{source} (" in message for source in sources) and "set mlmt.reward.leak_penalty=0" in message


@pytest.mark.parametrize("sources", [("arith",), ("math", "mbpp"), ("gsm8k",)])
def test_leak_penalty_on_rows_with_a_math_task_is_accepted(sources):
    LeakPenalty(0.5).check_data(_rows(*sources), "train.parquet")
