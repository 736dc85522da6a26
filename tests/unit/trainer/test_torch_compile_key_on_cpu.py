"""``actor.use_torch_compile`` is read by nothing in verl 0.9.1's engine workers (they read
``actor.fsdp_config.use_torch_compile``): a value that differs from the one read is rejected at start-up, naming both
keys (issue 17, item 8)."""

from __future__ import annotations

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config


@pytest.mark.parametrize("tree", ["actor_rollout_ref", "hl"])
def test_inert_actor_key_is_rejected_by_name(tree):
    config = compose_config([f"{tree}.actor.use_torch_compile=false"])
    with pytest.raises(ConfigError) as error:
        check_config(config)
    message = str(error.value)
    assert f"{tree}.actor.use_torch_compile=False" in message
    assert f"{tree}.actor.fsdp_config.use_torch_compile=True" in message


@pytest.mark.parametrize("tree", ["actor_rollout_ref", "hl"])
def test_keys_that_agree_pass(tree):
    check_config(compose_config([]))  # both true by default
    check_config(
        compose_config(
            [
                f"{tree}.actor.use_torch_compile=false",
                f"{tree}.actor.fsdp_config.use_torch_compile=false",
            ]
        )
    )
