"""The keys a dead rollout server's message names (agent_system.levels.policy.rollout_memory_keys): the ones that
size that level's server on that device, not the GPU keys on CPU."""

from __future__ import annotations

import pytest

from agent_system.levels.policy import rollout_memory_keys


@pytest.mark.parametrize(
    ("level", "rollout", "on_cpu", "keys"),
    [
        ("hl", "vllm", True, "hl.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"),
        ("ll", "vllm", True, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"),
        (
            "ll",
            "vllm",
            False,
            "actor_rollout_ref.rollout.gpu_memory_utilization, actor_rollout_ref.rollout.max_num_seqs",
        ),
        ("hl", "hf", True, "hl.rollout.engine_kwargs.hf.max_batch_size"),
    ],
)
def test_the_keys_that_size_the_server(level, rollout, on_cpu, keys):
    assert rollout_memory_keys(level, rollout, on_cpu) == keys


def test_the_device_defaults_to_this_process_backend():
    from agent_system import verl_plugin

    on_cpu = verl_plugin.CPU_BACKEND_ACTIVE
    assert rollout_memory_keys("hl", "vllm") == rollout_memory_keys("hl", "vllm", on_cpu)
    assert rollout_memory_keys("hl", "vllm") != rollout_memory_keys("hl", "vllm", not on_cpu)
