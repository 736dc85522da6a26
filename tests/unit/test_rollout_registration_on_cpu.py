"""Rollout backends reach verl through verl_compat.register_rollout, called by the plugin with the project's class
names: ``rollout.name=hf`` and ``rollout.name=vllm`` resolve to the project's replica and adapter classes."""

from __future__ import annotations

import pytest


def test_plugin_registers_the_hf_and_level_vllm_rollouts():
    import verl  # noqa: F401 - loads the project's plugin
    from verl.workers.rollout import base, replica

    from agent_system.cpu_backend.hf_rollout import HFRolloutReplica, HFServerAdapter

    assert base.get_rollout_class("hf") is HFServerAdapter
    assert replica.RolloutReplicaRegistry.get("hf") is HFRolloutReplica
    # Named only: importing the level vLLM classes would load vLLM.
    assert base._ROLLOUT_REGISTRY[("vllm", "async")] == "agent_system.levels.level_rollout.LevelServerAdapter"


def test_register_rollout_adds_any_named_backend():
    from agent_system import verl_compat

    verl_compat.register_rollout(
        "mlmt_unit_test_backend", replica="collections.OrderedDict", adapter="collections.Counter"
    )
    from verl.workers.rollout import base, replica

    try:
        import collections

        assert base.get_rollout_class("mlmt_unit_test_backend") is collections.Counter
        assert replica.RolloutReplicaRegistry.get("mlmt_unit_test_backend") is collections.OrderedDict
    finally:
        base._ROLLOUT_REGISTRY.pop(("mlmt_unit_test_backend", "async"))
        replica.RolloutReplicaRegistry._registry.pop("mlmt_unit_test_backend")


def test_register_rollout_rejects_a_bare_class_name():
    from agent_system import verl_compat

    with pytest.raises(ValueError, match="package.module.Class.*'HFRolloutReplica'"):
        verl_compat.register_rollout("hf2", replica="HFRolloutReplica", adapter="x.Y")
