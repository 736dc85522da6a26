"""verl's keys this trainer does not read stop the run when set, naming their replacement (issue 34, defect 3):
``algorithm.adv_estimator=reinforce`` (the seed scripts' selector) used to run GRPO without a word, and so were
``rollout.n``, ``rollout.val_kwargs.*``, ``trainer.critic_warmup`` and ``algorithm.kl_ctrl.*`` ignored. Each key of
``verl_keys.BYPASSED_VERL_KEYS``, on each policy tree, set to other than verl's default is refused; the default
config passes (the experiment scripts and recipes: tests/unit/test_experiment_plans_on_cpu.py)."""

from __future__ import annotations

import pytest
from config_copies import copier
from omegaconf import OmegaConf

from agent_system import verl_compat as vc
from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.verl_keys import BYPASSED_VERL_KEYS, POLICY, POLICY_TREES, bypassed_key_errors

KEYS = [
    (pattern.replace(POLICY, tree), pattern)
    for pattern in BYPASSED_VERL_KEYS
    for tree in (POLICY_TREES if pattern.startswith(POLICY) else ("",))
]


@pytest.fixture(scope="module")
def default_config():
    return compose_config([])


@pytest.fixture(scope="module")
def default_copy(default_config):
    return copier(default_config)


def _first_leaf(config, key):
    node = OmegaConf.select(config, key)
    while OmegaConf.is_dict(node):
        child = next(k for k in node.keys() if not str(k).startswith("_"))
        key, node = f"{key}.{child}", node[child]
    return key, node


def _other_than(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "_other"
    return "other"  # None, a list


def test_default_config_sets_none_of_them(default_config, default_copy):
    assert bypassed_key_errors(default_config) == []
    check_config(default_copy())


def test_every_listed_key_is_one_of_verls(default_config):
    defaults = vc.verl_default_config()
    for key, pattern in KEYS:
        assert OmegaConf.select(defaults, pattern.replace(POLICY, "actor_rollout_ref"), default="absent") != "absent"
        assert OmegaConf.select(default_config, key, default="absent") != "absent", key


@pytest.mark.parametrize(("key", "pattern"), KEYS)
def test_a_listed_key_set_is_refused_naming_its_replacement(default_copy, key, pattern):
    config = default_copy()
    leaf, value = _first_leaf(config, key)
    OmegaConf.update(config, leaf, _other_than(value), merge=False)
    with pytest.raises(ConfigError) as error:
        check_config(config)
    message = str(error.value)
    tree = key.split(".")[0]
    instead = BYPASSED_VERL_KEYS[pattern].replace("<tree>", tree if pattern.startswith(POLICY) else "<tree>")
    assert f"{leaf}=" in message and instead in message, message


@pytest.mark.parametrize(
    ("override", "replacement"),
    [
        ("algorithm.adv_estimator=reinforce", "mlmt.ll.adv_estimator / mlmt.hl.adv_estimator"),
        ("actor_rollout_ref.rollout.n=4", "mlmt.n"),
        ("hl.rollout.n=4", "mlmt.m"),
        ("actor_rollout_ref.rollout.val_kwargs.temperature=0.6", "validation decodes greedily"),
        ("hl.rollout.val_kwargs.n=4", "validation decodes greedily"),
        ("trainer.critic_warmup=10", "critics and actors update from step 1"),
        ("algorithm.kl_ctrl.kl_coef=0.05", "mlmt.stages.beta_turn1 / beta_turn2 / beta_turn3"),
        ("algorithm.kl_ctrl.type=adaptive", "mlmt.stages.beta_turn1"),
    ],
)
def test_the_seed_style_selectors_are_refused(override, replacement):
    with pytest.raises(ConfigError) as error:
        check_config(compose_config([override]))
    assert override.split("=")[0] in str(error.value) and replacement in str(error.value), str(error.value)


def test_verls_default_is_accepted_when_set_explicitly():
    check_config(compose_config(["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                                    "trainer.critic_warmup=0"]))  # fmt: skip
