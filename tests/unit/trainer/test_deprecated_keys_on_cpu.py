"""The deprecated β keys (``mlmt.stages.beta1 / beta2 / beta_l / beta_h``) still work: start-up moves them to the
per-turn keys (``beta_turn1 / beta_turn2 / beta_turn3``) once, with a warning naming both, and refuses a config that
sets an old key and its new key to different values (docs/CONFIG.md)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from omegaconf import OmegaConf

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.trainer import advantages as adv

SCORE_LIKE = ["mlmt.stages.schedule=[0,200]", "mlmt.stages.stage_ids=[1,2]", "mlmt.stages.alpha=[0.0,10.0]"]
OLD = [  # the seed's experiment scripts
    "mlmt.stages.beta1=[0.0,0.01]",
    "mlmt.stages.beta2=[0.1,0.0]",
    "mlmt.stages.beta_l=[0.01,0.01]",
    "mlmt.stages.beta_h=[0.0,0.02]",
]
NEW = ["mlmt.stages.beta_turn1=[0.1,0.01]", "mlmt.stages.beta_turn2=[0.0,0.02]", "mlmt.stages.beta_turn3=[0.01,0.01]"]
TURNS = np.array([1, 2, 3])


def _stages(overrides):
    config = compose_config(overrides)
    check_config(config)
    return config.mlmt.stages


def test_old_keys_give_each_stage_the_same_beta_per_turn_as_the_new_keys():
    old, new = _stages([*SCORE_LIKE, *OLD]), _stages([*SCORE_LIKE, *NEW])
    for step in (1, 199, 200, 500):  # stage I, then stage II
        assert adv.stage_at(old, step) == adv.stage_at(new, step)
    # stage I: turn 1 gets beta2's 0.1 (not beta1's 0.0); stage II: beta1's 0.01 (not beta2's 0.0)
    np.testing.assert_allclose(adv.kl_coefficients(TURNS, adv.stage_at(old, 1)[1]), [0.1, 0.0, 0.01])
    np.testing.assert_allclose(adv.kl_coefficients(TURNS, adv.stage_at(old, 200)[1]), [0.01, 0.02, 0.01])
    assert all(old[key] is None for key in ("beta1", "beta2", "beta_l", "beta_h"))


@pytest.mark.parametrize(
    ("overrides", "beta_turn1"),
    [
        (["mlmt.stages.beta1=[0.25]"], [0.25]),  # recipes/reinforce_kl's former key: stage II alone
        (["mlmt.stages.beta2=[0.1]", "mlmt.stages.stage_ids=[1]"], [0.1]),
        # stage II first, then stage I (tests/e2e/test_method_knobs_on_cpu.py's drift-then-pull run), beta1 unset
        (["mlmt.stages.schedule=[0,5]", "mlmt.stages.stage_ids=[2,1]", "mlmt.stages.beta2=[0.0,4.0]"], [0.0, 4.0]),
        (["mlmt.stages.schedule=[0,5]", "mlmt.stages.stage_ids=[2,1]", "mlmt.stages.beta1=[0.3,0.7]"], [0.3, 0.0]),
    ],
)
def test_beta1_and_beta2_fold_into_the_turn1_beta_of_each_stage(overrides, beta_turn1):
    assert list(compose_config(overrides).mlmt.stages.beta_turn1) == beta_turn1


def test_the_deprecation_warning_names_old_and_new_keys_once(caplog):
    with caplog.at_level(logging.WARNING, logger="agent_system.config"):
        config = compose_config([*SCORE_LIKE, *OLD])
        check_config(config)  # already converted: no second warning
    warnings = [record.getMessage() for record in caplog.records if "deprecated" in record.getMessage()]
    assert len(warnings) == 1, warnings
    for text in (
        "mlmt.stages.beta1=[0.0, 0.01], mlmt.stages.beta2=[0.1, 0.0] -> mlmt.stages.beta_turn1=[0.1, 0.01]",
        "mlmt.stages.beta_l=[0.01, 0.01] -> mlmt.stages.beta_turn3=[0.01, 0.01]",
        "mlmt.stages.beta_h=[0.0, 0.02] -> mlmt.stages.beta_turn2=[0.0, 0.02]",
    ):
        assert text in warnings[0]


def test_new_keys_alone_log_no_deprecation(caplog):
    with caplog.at_level(logging.WARNING, logger="agent_system.config"):
        _stages([*SCORE_LIKE, *NEW])
    assert not [record for record in caplog.records if "deprecated" in record.getMessage()]


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["mlmt.stages.beta_turn1=[0.2]", "mlmt.stages.beta1=[0.1]"], ["mlmt.stages.beta1", "mlmt.stages.beta_turn1"]),
        (
            [*SCORE_LIKE, *NEW, "mlmt.stages.beta2=[0.2,0.0]"],  # an old key appended to a script's new keys
            ["mlmt.stages.beta2", "mlmt.stages.beta_turn1"],
        ),
        (
            ["mlmt.stages.beta_turn3=[0.01]", "mlmt.stages.beta_l=[0.02]"],
            ["mlmt.stages.beta_l", "mlmt.stages.beta_turn3"],
        ),
        (
            ["mlmt.stages.beta_turn2=[0.5]", "mlmt.stages.beta_h=[0.0]"],
            ["mlmt.stages.beta_h", "mlmt.stages.beta_turn2"],
        ),
    ],
)
def test_an_old_key_set_unlike_its_new_key_is_refused_naming_both(overrides, keys):
    with pytest.raises(ConfigError) as error:
        compose_config(overrides)
    for key in keys:
        assert key in str(error.value), str(error.value)


def test_an_old_key_set_like_its_new_key_is_accepted():
    stages = _stages(["mlmt.stages.beta_turn3=[0.01]", "mlmt.stages.beta_l=[0.01]"])
    assert list(stages.beta_turn3) == [0.01] and stages.beta_l is None


def test_validation_converts_old_keys_set_after_composition():
    config = compose_config([*SCORE_LIKE, *NEW])
    OmegaConf.update(config, "mlmt.stages.beta_turn1", [0.0])  # back to the default: unset
    OmegaConf.update(config, "mlmt.stages.beta1", [0.0, 0.01, 0.02])
    with pytest.raises(ConfigError, match=r"mlmt.stages.beta1 has 3 values; mlmt.stages.schedule has 2"):
        check_config(config)
    OmegaConf.update(config, "mlmt.stages.beta1", [0.0, 0.03])
    check_config(config)
    assert list(config.mlmt.stages.beta_turn1) == [0.0, 0.03] and config.mlmt.stages.beta1 is None
