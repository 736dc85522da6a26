"""Settings that cannot act are rejected at start-up, before any worker starts, naming the keys (issue 16, items 2
and 6; issue 34, items 5 and 6): each case fails ``validate_config`` (or the data-dependent ``check_stages_reached``),
its neighbour that can act passes."""

from __future__ import annotations

import pandas as pd
import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config, check_stages_reached, preflight
from agent_system.launcher.plan import build_plan
from agent_system.trainer.advantages import stage_at

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
    # T = 0 on a level that updates: every sampled token's log-prob is 0 and its gradient 0, whatever the estimator
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2"], ["hl.rollout.temperature=0",
                                                                              "mlmt.hl.freeze"]),
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=rloo", "mlmt.m=3"], ["hl.rollout.temperature=0"]),
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=reinforce", "mlmt.m=2"], ["hl.rollout.temperature=0"]),
    (["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=reinforce", "mlmt.m=1"], ["hl.rollout.temperature=0"]),
    (["actor_rollout_ref.rollout.temperature=0"], ["actor_rollout_ref.rollout.temperature=0", "mlmt.ll.freeze"]),
    (["actor_rollout_ref.rollout.temperature=0", "mlmt.feedback=none", "mlmt.ll.adv_estimator=reinforce"],
     ["actor_rollout_ref.rollout.temperature=0"]),
    (["actor_rollout_ref.rollout.temperature=0", "mlmt.hl.freeze=true"], ["actor_rollout_ref.rollout.temperature=0"]),
    (["algorithm.use_kl_in_reward=true"], ["algorithm.use_kl_in_reward=true"]),
    # single turn: no refinements to count or group
    (["mlmt.feedback=none", "mlmt.m=4"], ["mlmt.m=4", "mlmt.feedback=none"]),
    (["mlmt.feedback=none", "mlmt.ll.turn3_group_by=attempt"], ["mlmt.ll.turn3_group_by=attempt",
                                                                "mlmt.feedback=none"]),
    (["mlmt.feedback=none", "mlmt.ll.turn3_group_by=attempt", "mlmt.m=1"], ["mlmt.ll.turn3_group_by=attempt",
                                                                              "mlmt.feedback=none"]),
]  # fmt: skip

ACCEPTED = [
    ["mlmt.hl.freeze=true", "mlmt.reward.hl_reward=r3"],
    ["mlmt.ll.turn3_group_by=attempt", "mlmt.ll.adv_estimator=grpo"],
    ["mlmt.ll.freeze=true"],  # stage II only
    ["hl.rollout.temperature=0", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2", "mlmt.hl.freeze=true"],  # HL never trains
    ["hl.rollout.temperature=0", "mlmt.feedback=self"],  # no HL
    ["actor_rollout_ref.rollout.temperature=0", "mlmt.ll.freeze=true"],  # the LL never trains
    ["mlmt.feedback=none", "mlmt.m=1"],
    ["mlmt.feedback=none"],  # the default m (the CPU overlay's 3), left alone
    ["mlmt.feedback=self", "mlmt.m=4"],  # four self-refinements per attempt
    ["hl.rollout.temperature=0.7", "mlmt.hl.adv_estimator=grpo", "mlmt.m=2"],
]


@pytest.mark.parametrize(("overrides", "keys"), REJECTED)
def test_setting_that_cannot_act_is_rejected_naming_its_keys(overrides, keys):
    with pytest.raises(ConfigError) as error:
        check_config(compose_config(overrides))
    for key in keys:
        assert key in str(error.value), (key, str(error.value))


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_neighbour_that_can_act_is_accepted(overrides):
    check_config(compose_config(overrides))


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
    check_config(config)  # nothing data-free is wrong with it
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


def _stages(schedule: list[int]) -> list[str]:
    zeros = ",".join(["0"] * len(schedule))
    return [
        f"mlmt.stages.schedule=[{','.join(map(str, schedule))}]",
        f"mlmt.stages.stage_ids=[{','.join(['2'] * len(schedule))}]",
        *[f"mlmt.stages.{key}=[{zeros}]" for key in ("beta_turn1", "beta_turn2", "beta_turn3", "alpha")],
        "trainer.total_training_steps=100",
    ]


@pytest.mark.parametrize(
    ("schedule", "stage", "fixed"),
    [([0, 1], 0, [0, 2]), ([0, 0], 0, [0, 2]), ([0, 5, 5], 1, [0, 5, 6]), ([0, 5, 6, 6], 2, [0, 5, 6, 7])],
)
def test_stage_that_the_next_one_replaces_before_it_runs_is_rejected(schedule, stage, fixed):
    """Steps count from 1: a stage at 0 followed by one at 1, or two stages at one step, leave a stage that never runs
    (``advantages.stage_at`` picks the last stage started), as one that starts after the last step."""
    config = compose_config(_stages(schedule))
    check_config(config)  # nothing else is wrong with it
    assert {s.index for s in build_plan(config, 10, None).stages if not s.reached} == {stage}  # NEVER REACHED
    assert stage not in {stage_at(config.mlmt.stages, step)[0] for step in range(1, 101)}
    with pytest.raises(ConfigError) as error:
        check_stages_reached(config, train_rows=10)
    message = str(error.value)
    assert f"mlmt.stages.schedule={schedule}" in message and f"stage {stage} never runs" in message, message
    check_stages_reached(compose_config(_stages(fixed)), train_rows=10)


def test_m_is_inert_without_turn_3():
    """Why ``mlmt.m`` is refused with ``mlmt.feedback=none``: the run's rows and generations do not depend on it."""
    plans = [build_plan(compose_config(["mlmt.feedback=none", f"mlmt.m={m}"]), 10, None) for m in (1, 4)]
    assert plans[0].samples_per_step == plans[1].samples_per_step
    assert plans[0].levels["ll"].rows_per_update == plans[1].levels["ll"].rows_per_update
    with_turn3 = [build_plan(compose_config(["mlmt.feedback=self", f"mlmt.m={m}"]), 10, None) for m in (1, 4)]
    assert with_turn3[0].samples_per_step < with_turn3[1].samples_per_step
