"""Which levels get a value model (``config.critic_levels``, what ``main.build_trainer`` builds and the trainer
saves with every checkpoint): a level whose estimator is registered with ``critic=True``, unless it is frozen (issue
16, item 9: a frozen level's critic was built, held in memory and written to every checkpoint although it never
acted). The run plan, the shared-path check and the model-path resolution follow the same rule (issue 35).
"""

import pytest
from config_copies import copier
from omegaconf import OmegaConf

from agent_system import methods
from agent_system.config import compose_config
from agent_system.launcher.gpu_checks import shared_paths
from agent_system.launcher.main import resolve_model_paths
from agent_system.launcher.plan import critic_name
from agent_system.trainer.advantages import VALUE_ESTIMATORS, critic_levels, register_value_estimator

BASE = copier(compose_config([]))  # composed once: the cases below change only mlmt keys
# the method packages register their estimators (value_baseline: methods/value_shaping) when imported, as start-up
# does (check_config); without this the value_baseline case failed when the file ran alone (it passed only after some
# other test had imported them)
methods.import_all()


def _levels(*overrides: str) -> tuple[str, ...]:
    config = BASE()
    for override in overrides:
        key, value = override.split("=")
        OmegaConf.update(config, key, OmegaConf.create(f"v: {value}").v)  # YAML-typed, as Hydra reads it
    return critic_levels(config)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), ()),  # grpo at both levels: no critic
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae"), ("ll", "hl")),
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.hl.freeze=true"), ("ll",)),
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.ll.freeze=true"), ("hl",)),
        (("mlmt.hl.adv_estimator=gae", "mlmt.hl.freeze=true"), ()),
        (("mlmt.ll.adv_estimator=value_baseline",), ("ll",)),
        # no HL without a feedback writer: its estimator has no critic to build
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.feedback=self"), ("ll",)),
    ],
)
def test_a_critic_for_each_training_level_whose_estimator_reads_one(overrides, expected):
    assert _levels(*overrides) == expected


@pytest.fixture
def estimator_with_critic():
    """A method's estimator registered with ``critic=True``, unregistered after the test."""
    name = "dummy_with_critic"
    register_value_estimator(name, critic=True)(lambda rewards, values, mask, config: (values, values))
    try:
        yield name
    finally:
        del VALUE_ESTIMATORS[name]


def _model_folder(path):
    path.mkdir()
    (path / "config.json").write_text("{}")


def _critic_path_resolved(config, tmp_path, monkeypatch, critic_tree: str) -> str:
    """``<critic_tree>.model.path`` after ``main.resolve_model_paths``, set to the alias ``~/critic_model``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _model_folder(tmp_path / "policy")
    _model_folder(tmp_path / "critic_model")
    for tree in ("actor_rollout_ref", "hl", "critic", "hl_critic"):
        OmegaConf.update(config, f"{tree}.model.path", str(tmp_path / "policy"))
    OmegaConf.update(config, f"{critic_tree}.model.path", "~/critic_model")
    resolve_model_paths(config)
    return OmegaConf.select(config, f"{critic_tree}.model.path")


def test_an_estimator_registered_with_a_critic_gets_one_in_every_start_up_step(
    estimator_with_critic, tmp_path, monkeypatch
):
    # issue 35: the registry's critic=True is the one rule; no file of the trainer names the new estimator
    config = BASE()
    OmegaConf.update(config, "mlmt.hl.adv_estimator", estimator_with_critic)
    assert critic_levels(config) == ("hl",)
    assert critic_name(config, "hl") == "hl_critic" and critic_name(config, "ll") == "none"
    assert "hl_critic.model.path" in shared_paths(config) and "critic.model.path" not in shared_paths(config)
    assert _critic_path_resolved(config, tmp_path, monkeypatch, "hl_critic") == str(tmp_path / "critic_model")


def test_the_value_baseline_critic_path_alias_is_resolved(tmp_path, monkeypatch):
    # issue 35: prepare_config resolved a critic's model path for gae only, so value_baseline's critic got "~/..."
    config = BASE()
    OmegaConf.update(config, "mlmt.ll.adv_estimator", "value_baseline")
    assert _critic_path_resolved(config, tmp_path, monkeypatch, "critic") == str(tmp_path / "critic_model")
