"""A level with no planned update is frozen whichever key says so (issue 34, defect 4): ``mlmt.<level>.freeze=true``
or a zero period in ``mlmt.schedule`` (tL for the LL, tH for the HL). Every start-up refusal of a setting that acts
only on a trained level fires for both; references and critics are not built for either; a zero period beside a freeze
of the other level (which used to train the LL on every step) is refused; the schedule never trains such a level."""

from __future__ import annotations

import pytest

from agent_system.config import ConfigError, compose_config, frozen_levels, reference_needed
from agent_system.launcher.main import check_config
from agent_system.launcher.plan import level_update_steps
from agent_system.trainer.advantages import critic_levels

FREEZE = {"hl": ["mlmt.hl.freeze=true"], "ll": ["mlmt.ll.freeze=true"]}
ZERO_PERIOD = {"hl": ["mlmt.schedule.tH=0"], "ll": ["mlmt.schedule.tL=0"]}
FROZEN_BY = {"hl": {"freeze": "mlmt.hl.freeze=true", "period": "mlmt.schedule.tH=0"},
             "ll": {"freeze": "mlmt.ll.freeze=true", "period": "mlmt.schedule.tL=0"}}  # fmt: skip

# (level, overrides that act only when that level trains, the key the refusal names)
INERT_WHEN_FROZEN = [
    ("hl", ["mlmt.reward.hl_reward=contrastive"], "mlmt.reward.hl_reward=contrastive"),
    ("hl", ["mlmt.reward.confidence_lambda=0.5"], "mlmt.reward.confidence_lambda=0.5"),
    ("hl", ["mlmt.reward.leak_penalty=1.0"], "mlmt.reward.leak_penalty=1.0"),
    ("hl", ["mlmt.stages.beta_turn2=[0.1]"], "mlmt.stages.beta_turn2"),
    ("hl", ["mlmt.reward.hl_reward=progress", "mlmt.stages.alpha=[1.0]", "mlmt.hl.adv_estimator=reinforce",
            "mlmt.m=1"], "mlmt.reward.hl_reward=progress"),
    ("hl", ["mlmt.ll.adv_estimator=value_baseline", "mlmt.reward.hl_reward=value_shaped"],
     "mlmt.reward.hl_reward=value_shaped"),
    ("hl", ["hl.model.lora_rank=8"], "hl.model.lora_rank=8"),
    ("ll", ["mlmt.stages.beta_turn1=[0.1]"], "mlmt.stages.beta_turn1"),
    ("ll", ["mlmt.stages.beta_turn3=[0.1]"], "mlmt.stages.beta_turn3"),
    ("ll", ["mlmt.stages.schedule=[0,5]", "mlmt.stages.stage_ids=[1,2]", "mlmt.stages.beta_turn1=[0,0]",
            "mlmt.stages.beta_turn2=[0,0]", "mlmt.stages.beta_turn3=[0,0]", "mlmt.stages.alpha=[0,0]"],
     "mlmt.stages.stage_ids"),
    ("ll", ["mlmt.stages.alpha=[1.0]"], "mlmt.stages.alpha"),  # issue 34, item 9: α with a frozen LL acts nowhere
    ("ll", ["mlmt.ll.ref_refresh_freq=5", "actor_rollout_ref.actor.use_kl_loss=true"], "mlmt.ll.ref_refresh_freq=5"),
    ("ll", ["mlmt.ll.adv_estimator=value_baseline"], "mlmt.ll.adv_estimator=value_baseline"),
    ("ll", ["mlmt.ll.adv_estimator=archer", "mlmt.n=1", "mlmt.m=1", "mlmt.hl.adv_estimator=reinforce"],
     "mlmt.ll.adv_estimator=archer"),  # issue 34, item 9: the critic would start and train for nothing
    ("ll", ["actor_rollout_ref.model.lora_rank=8"], "actor_rollout_ref.model.lora_rank=8"),
]  # fmt: skip


@pytest.mark.parametrize("how", ["freeze", "period"])
@pytest.mark.parametrize(("level", "overrides", "key"), INERT_WHEN_FROZEN)
def test_a_setting_for_a_trained_level_is_refused_whichever_key_freezes_it(level, overrides, key, how):
    frozen_by = (FREEZE if how == "freeze" else ZERO_PERIOD)[level]
    check_config(compose_config(overrides))  # the level trains: the setting acts
    with pytest.raises(ConfigError) as error:
        check_config(compose_config([*overrides, *frozen_by]))
    assert key in str(error.value) and FROZEN_BY[level][how] in str(error.value), str(error.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["mlmt.schedule.tL=0", "mlmt.hl.freeze=true"], ["mlmt.schedule.tL=0", "mlmt.hl.freeze=true"]),
        (["mlmt.schedule.tH=0", "mlmt.ll.freeze=true"], ["mlmt.schedule.tH=0", "mlmt.ll.freeze=true"]),
        (["mlmt.schedule.tL=0", "mlmt.feedback=self"], ["mlmt.schedule.tL=0", "mlmt.feedback=self"]),
        (["mlmt.ll.freeze=true", "mlmt.hl.freeze=true"], ["mlmt.ll.freeze=true", "mlmt.hl.freeze=true"]),
    ],
)
def test_a_zero_period_beside_a_freeze_of_the_other_level_is_refused(overrides, named):
    with pytest.raises(ConfigError, match="nothing would be trained") as error:
        check_config(compose_config(overrides))
    assert all(key in str(error.value) for key in named), str(error.value)


@pytest.mark.parametrize(("level", "period"), [("hl", "mlmt.schedule.tH=0"), ("ll", "mlmt.schedule.tL=0")])
def test_a_zero_period_level_gets_no_update_reference_or_critic(level, period):
    estimator = [f"mlmt.{level}.adv_estimator=gae", f"{'actor_rollout_ref' if level == 'll' else 'hl'}.actor"
                 ".use_kl_loss=true"]  # fmt: skip
    trained = compose_config(estimator)
    assert level in critic_levels(trained) and reference_needed(trained)[level]
    config = compose_config([*estimator, period])
    check_config(config)
    assert frozen_levels(config) == {"ll": level == "ll", "hl": level == "hl"}
    assert level not in critic_levels(config) and not reference_needed(config)[level]
    steps = level_update_steps(config, 30)
    other = "ll" if level == "hl" else "hl"
    assert steps[level] == [] and steps[other] == list(range(1, 31))
