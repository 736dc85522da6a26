"""A key the config does not have is refused at start-up with the key meant (issue 42, point 6): Hydra's hint for a
misspelt key is to add '+', after which `+mlmt.schedule.tl=15` ran with rc 0 and the schedule unchanged, as did
`+overlays=cpu`. Keys under the maps handed on whole (vLLM's engine arguments, HF config overrides, Ray's runtime
environment, prompt templates) and verl's keys its YAML leaves out stay accepted.

    .venv/bin/python -m pytest tests/unit/trainer/test_unknown_keys_on_cpu.py
"""

from __future__ import annotations

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import prepare_config


def _prepare(overrides: list[str], tmp_path):
    overrides = [*overrides, f"trainer.default_local_dir={tmp_path}"]
    return prepare_config(compose_config(overrides), overrides)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+mlmt.schedule.tl=15", r"did you mean mlmt.schedule.tL\? \(set it without '\+': mlmt.schedule.tL=15\)"),
        ("++trainer.total_trainig_steps=3", r"did you mean trainer.total_training_steps\?"),
        ("+overlays=cpu", r"\+overlays=cpu: overlays is not a section of the config"),
        ("+mlmt.prompts.overridesX=1", r"mlmt.prompts.overridesX is not a key of the config"),
    ],
)
def test_an_unknown_key_is_refused_with_the_key_meant(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        _prepare([override], tmp_path)


def test_keys_under_open_maps_and_verl_s_absent_keys_are_accepted(tmp_path):
    config = _prepare(
        [
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_batched_tokens=4096",
            "+actor_rollout_ref.model.override_config.rope_theta=10000",
            "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
            "+mlmt.prompts.overrides.solve='{problem}'",
            "++mlmt.n=3",
        ],
        tmp_path,
    )
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_batched_tokens == 4096 and config.mlmt.n == 3


def test_the_check_runs_inside_the_entry_point_s_hydra(tmp_path):
    """The entry point's @hydra.main has initialised Hydra when the check composes the defaults: it must use that
    instance (was: "GlobalHydra is already initialized" on every run through the entry point)."""
    from hydra import initialize_config_dir

    from agent_system import config as config_module

    config_module._composed_without_overrides.cache_clear()  # composed afresh, under the initialised instance
    with initialize_config_dir(str(config_module.CONFIG_DIR), version_base=None):
        with pytest.raises(ConfigError, match=r"did you mean mlmt.schedule.tL\?"):
            _prepare(["+mlmt.schedule.tl=15"], tmp_path)
