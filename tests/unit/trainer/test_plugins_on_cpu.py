"""A method from outside the package plugs in with no file of the trainer changed (issue 35, item 2): a module named in
``mlmt.plugins`` registers an estimator with a critic, a config check, a model path, a Ray actor's resources and an
extension with its own critic loss, and each acts where the trainer's own methods do: the accepted estimators, the
start-up refusals, the levels that get a critic (and the plan's line for it), the model paths checked on every node,
the pools checked against the cluster, the critic's loss.
"""

from __future__ import annotations

import sys

import pytest
import torch

from agent_system import methods
from agent_system.config import ConfigError, compose_config
from agent_system.launcher.gpu_checks import model_path_keys, pool_demands
from agent_system.launcher.main import _critic_loss, check_config
from agent_system.launcher.plan import critic_name
from agent_system.trainer import advantages as adv

PLUGIN = """
from agent_system.trainer.advantages import register_value_estimator
from agent_system.trainer.hooks import Extension

NAME = "centred_by_critic"


@register_value_estimator(NAME, critic=True)
def advantages(token_level_rewards, values, response_mask, config):
    return (token_level_rewards - values) * response_mask, token_level_rewards


def config_errors(config, frozen):
    if config.mlmt.ll.adv_estimator == NAME and config.mlmt.n != 3:
        return [f"mlmt.ll.adv_estimator={NAME} needs mlmt.n=3 (got {config.mlmt.n})"]
    return []


def model_path_keys(config):
    return ["mlmt.dataset.seed"] if config.mlmt.ll.adv_estimator == NAME else []


def resource_demands(config):
    return [("centred critic's helper actor", {"GPU": 1.0})] if config.mlmt.ll.adv_estimator == NAME else []


def critic_loss(config, model_output, data, dp_group=None):
    return "the plug-in's loss"


class Centred(Extension):
    name = NAME

    def critic_loss(self, level):
        return critic_loss if level == "ll" else None


def extension(config):
    return Centred() if config.mlmt.ll.adv_estimator == NAME else None


def own_critics(config):
    return {"hl": "plugin_under_test's own value head"} if config.mlmt.ll.adv_estimator == NAME else {}
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module ``plugin_under_test`` on sys.path; its registration removed after the test."""
    (tmp_path / "plugin_under_test.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(adv, "VALUE_ESTIMATORS", dict(adv.VALUE_ESTIMATORS))
    yield "plugin_under_test"
    sys.modules.pop("plugin_under_test", None)


def _config(*overrides: str):
    return compose_config(["mlmt.ll.adv_estimator=centred_by_critic", *overrides])


def test_without_the_plugin_the_estimator_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"mlmt.ll.adv_estimator='centred_by_critic': choose one of \("):
        check_config(_config("mlmt.n=3"))


def test_archers_own_critic_is_named_in_the_plan():
    config = compose_config(["mlmt.ll.adv_estimator=archer"])
    assert critic_name(config, "ll") == "mlmt.archer (utterance critic, constant lr)"
    assert critic_name(config, "hl") == "none"
    assert critic_name(compose_config([]), "ll") == "none"


def test_a_missing_plugin_module_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"mlmt.plugins: cannot import 'no_such_plugin_module'"):
        check_config(compose_config(["mlmt.plugins=[no_such_plugin_module]"]))


def test_the_plugins_estimator_check_critic_paths_and_loss_act(plugin):
    with pytest.raises(ConfigError, match=r"mlmt.ll.adv_estimator=centred_by_critic needs mlmt.n=3 \(got 2\)"):
        check_config(_config(f"mlmt.plugins=[{plugin}]", "mlmt.n=2"))
    config = _config(f"mlmt.plugins=[{plugin}]", "mlmt.n=3")
    check_config(config)  # accepted: the estimator is registered, its check passes
    assert "centred_by_critic" in adv.estimator_names()
    assert adv.critic_levels(config) == ("ll",)
    assert critic_name(config, "ll") == "critic"  # the plan and memory estimate count its critic
    assert critic_name(config, "hl") == "plugin_under_test's own value head"  # a critic it trains itself
    assert "critic.model.path" in model_path_keys(config) and "mlmt.dataset.seed" in model_path_keys(config)
    assert pool_demands(config, "GPU")[-1].what == "centred critic's helper actor"  # checked with the pools
    extensions = methods.load(config)
    assert [extension.name for extension in extensions] == ["centred_by_critic"]
    assert _critic_loss(extensions, "ll")(None, None, None) == "the plug-in's loss"
    assert _critic_loss(extensions, "hl") is None  # verl's value loss
    rewards, values, mask = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.25, 0.5]]), torch.ones(1, 2)
    advantages, returns = adv.compute_advantages("centred_by_critic", rewards, mask, None, None, values)
    assert torch.equal(advantages, torch.tensor([[-0.25, 0.5]])) and torch.equal(returns, rewards)


def test_one_plugin_module_may_be_given_without_brackets(plugin):
    """mlmt.plugins=my.mod is that module (was: read letter by letter, "cannot import 'p'"); a value that is not a
    module name is refused by name."""
    config = _config(f"mlmt.plugins={plugin}", "mlmt.n=3")
    assert methods.plugin_names(config) == [plugin]
    check_config(config)
    assert "centred_by_critic" in adv.estimator_names()
    with pytest.raises(ConfigError, match=r"mlmt.plugins=.*give module names"):
        methods.plugin_names(compose_config(["mlmt.plugins=[1,2]"]))


def test_the_plan_names_each_level_s_estimator_and_the_plugins(plugin):
    from agent_system.launcher.main import set_schedule_horizon
    from agent_system.launcher.plan import build_plan, render_markdown

    config = _config(f"mlmt.plugins=[{plugin}]", "mlmt.n=3", "mlmt.hl.adv_estimator=reinforce")
    check_config(config)
    set_schedule_horizon(config, 256)
    plan = build_plan(config, 256, None)
    assert (plan.levels["ll"].estimator, plan.levels["hl"].estimator) == ("centred_by_critic", "reinforce")
    text = render_markdown(plan)
    assert f"- plug-ins (mlmt.plugins): {plugin}" in text
    assert "- estimator: centred_by_critic (mlmt.ll.adv_estimator)" in text
