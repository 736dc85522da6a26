"""Settings that cannot act are rejected at start-up, before any worker starts, naming the keys (issue 16, items 2
and 6): each case fails ``validate_config`` (or the data-dependent ``check_stages_reached``), its neighbour that can
act passes."""

from __future__ import annotations

import pandas as pd
import pytest

from agent_system.trainer.config import ConfigError, compose_config, validate_config
from agent_system.trainer.main import check_stages_reached, preflight

REJECTED = [
    (["mlmt.hl.freeze=true", "mlmt.reward.hl_reward=contrastive"], ["mlmt.reward.hl_reward=contrastive",
                                                                    "mlmt.hl.freeze=true"]),
    (["mlmt.hl.freeze=true", "mlmt.reward.confidence_lambda=0.5"], ["mlmt.reward.confidence_lambda=0.5",
                                                                    "mlmt.hl.freeze=true"]),
    (["mlmt.ll.turn3_group_by=attempt", "mlmt.ll.adv_estimator=reinforce"], ["mlmt.ll.turn3_group_by=attempt",
                                                                             "mlmt.ll.adv_estimator=reinforce"]),
    (["mlmt.ll.turn3_group_by=attempt", "mlmt.ll.adv_estimator=reinforce_plus_plus"], ["mlmt.ll.turn3_group_by"]),
    (["mlmt.ll.freeze=true", "mlmt.stages.schedule=[0,5]", "mlmt.stages.stage_ids=[1,2]",
      "mlmt.stages.beta_turn1=[0,0]", "mlmt.stages.beta_turn2=[0,0]", "mlmt.stages.beta_turn3=[0,0]",
      "mlmt.stages.alpha=[0,0]"], ["mlmt.stages.stage_ids", "mlmt.ll.freeze=true"]),
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2"], ["hl.rollout.temperature=0",
                                                                              "mlmt.hl.adv_estimator=grpo",
                                                                              "mlmt.m=2"]),
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=rloo", "mlmt.m=3"], ["hl.rollout.temperature=0"]),
    (["algorithm.use_kl_in_reward=true"], ["algorithm.use_kl_in_reward=true"]),
]  # fmt: skip

ACCEPTED = [
    ["mlmt.hl.freeze=true", "mlmt.reward.hl_reward=r3"],
    ["mlmt.ll.turn3_group_by=attempt", "mlmt.ll.adv_estimator=grpo"],
    ["mlmt.ll.freeze=true"],  # stage II only
    ["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=reinforce", "mlmt.m=2"],  # no group to cancel in
    ["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2", "mlmt.hl.freeze=true"],  # HL never trains
    ["hl.rollout.temperature=0.7", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2"],
]


@pytest.mark.parametrize(("overrides", "keys"), REJECTED)
def test_setting_that_cannot_act_is_rejected_naming_its_keys(overrides, keys):
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config(overrides))
    for key in keys:
        assert key in str(error.value), (key, str(error.value))


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_neighbour_that_can_act_is_accepted(overrides):
    validate_config(compose_config(overrides))


STAGES_200 = [
    "mlmt.stages.schedule=[0,200]",
    "mlmt.stages.stage_ids=[1,2]",
    "mlmt.stages.beta_turn1=[0.1,0.01]",
    "mlmt.stages.beta_turn2=[0,0]",
    "mlmt.stages.beta_turn3=[0.01,0.01]",
    "mlmt.stages.alpha=[0,10]",
]
EARLY = ["trainer.total_training_steps=null", "trainer.total_epochs=3", "data.train_batch_size=128"]


def test_stage_after_the_last_step_is_rejected_with_epochs_computed_from_the_data():
    # the early math scripts' setting: 3 epochs of MATH's 7,500 problems at 128 per step = 3 × 58 = 174 steps
    config = compose_config([*EARLY, *STAGES_200])
    validate_config(config)  # nothing data-free is wrong with it
    with pytest.raises(ConfigError) as error:
        check_stages_reached(config, train_rows=7500)
    message = str(error.value)
    assert "mlmt.stages.schedule=[0, 200]" in message and "last step 174" in message and "7500" in message
    check_stages_reached(config, train_rows=9000)  # 3 × 70 = 210 steps: stage II from step 200
    fixed = compose_config([*STAGES_200, "trainer.total_training_steps=199"])
    with pytest.raises(ConfigError, match="trainer.total_training_steps=199"):
        check_stages_reached(fixed, train_rows=10)
    check_stages_reached(compose_config([*STAGES_200, "trainer.total_training_steps=200"]), train_rows=10)


def test_preflight_rejects_it_from_the_data_files(tmp_path):
    train = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": [f"p{i}" for i in range(300)]}).to_parquet(train)
    config = compose_config(
        [*EARLY, *STAGES_200, f"data.train_files={train}", f"trainer.default_local_dir={tmp_path / 'run'}"]
    )
    with pytest.raises(ConfigError, match=r"mlmt.stages.schedule.*last step 6 "):  # 3 × ⌊300 / 128⌋
        preflight(config)
    assert not (tmp_path / "run" / "run_plan.json").exists()
