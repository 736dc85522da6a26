"""The sleep level reaches verl's vLLM server (issue 43, item 7): ``verl_compat.sleep_replicas`` with ``keep_weights``
has verl 0.9.1's own ``vLLMHttpServer.sleep`` call vLLM's ``sleep(level=1)``, and without it the level verl resolves
(2 for full weights). vLLM's sleep mode needs CUDA, so the engine under the server records its calls; everything
above it is verl's code (``CheckpointEngineManager.sleep_replicas``, ``vLLMReplica.sleep``, ``vLLMHttpServer.sleep``),
and the recorded keywords are bound to the installed vLLM's ``AsyncLLM.sleep`` signature. Ray's transport is the one
stand-in: a handle that runs each remote call on the server object in this process."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import ray

from agent_system import verl_compat


class _Engine:
    """vLLM's ``AsyncLLM`` as verl's server calls it: the calls, with their keywords."""

    def __init__(self) -> None:
        self.calls = []

    async def sleep(self, **kwargs) -> None:
        self.calls.append(("sleep", kwargs))

    async def reset_encoder_cache(self) -> None:
        self.calls.append(("reset_encoder_cache", {}))

    async def wait_for_requests_to_drain(self) -> None:
        self.calls.append(("wait_for_requests_to_drain", {}))


class _Handle:
    """A Ray actor handle that runs ``handle.method.remote(...)`` and ``__ray_call__`` on ``server`` in this process."""

    def __init__(self, server) -> None:
        self.server = server
        self.__ray_call__ = SimpleNamespace(remote=lambda fn, *args: fn(server, *args))

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.server, name))


def _verl_server(lora_rank: int = 0):
    """verl's ``vLLMHttpServer`` as a colocated (hybrid) level's server in sleep mode, without its ``__init__`` (which
    launches vLLM): the attributes its ``sleep`` reads."""
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    server = object.__new__(vLLMHttpServer)
    server.node_rank, server.rollout_mode, server.engine = 0, RolloutMode.HYBRID, _Engine()
    server.config = SimpleNamespace(free_cache_engine=True, mtp=None)
    server.model_config = SimpleNamespace(lora_rank=lora_rank, lora={})
    return server


def _manager(servers):
    """verl's ``CheckpointEngineManager`` over one ``vLLMReplica`` of ``servers``, without their ``__init__``."""
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    replica = object.__new__(vLLMReplica)
    replica.servers = [_Handle(server) for server in servers]
    manager = object.__new__(CheckpointEngineManager)
    manager.replicas = [replica]
    return manager


def _sleep_levels(server) -> list:
    return [kwargs for call, kwargs in server.engine.calls if call == "sleep"]


@pytest.fixture
def no_ray_transport(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda values: values)  # the handle's calls ran already; nothing starts Ray


def test_keep_weights_sleeps_verls_server_at_level_1_and_then_gives_it_back_its_level(no_ray_transport):
    from vllm.v1.engine.async_llm import AsyncLLM

    servers = [_verl_server(), _verl_server()]
    verl_compat.sleep_replicas(_manager(servers), keep_weights=True)
    for server in servers:
        assert _sleep_levels(server) == [{"level": verl_compat.KEEP_WEIGHTS_SLEEP_LEVEL}] == [{"level": 1}]
        inspect.signature(AsyncLLM.sleep).bind(None, **_sleep_levels(server)[0])  # vLLM's keyword
        assert "_resolve_sleep_level" not in vars(server)  # verl's own resolution again after the sleep
    verl_compat.sleep_replicas(_manager(servers), keep_weights=False)
    assert [_sleep_levels(server)[-1] for server in servers] == [{"level": 2}] * 2  # verl's level: weights discarded


def test_without_keep_weights_a_lora_level_keeps_verls_level_1():
    server = _verl_server(lora_rank=8)
    verl_compat.sleep_replicas(_manager([server]), keep_weights=False)
    assert _sleep_levels(server) == [{"level": 1}]


def test_the_pinned_level_shadows_the_method_verl_resolves_it_with():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    assert list(inspect.signature(vLLMHttpServer._resolve_sleep_level).parameters) == ["self"]
    assert "self._resolve_sleep_level()" in inspect.getsource(vLLMHttpServer._sleep_hybrid)
    server = _verl_server()
    verl_compat.pin_sleep_level(server, 1)
    assert server._resolve_sleep_level() == 1
    verl_compat.pin_sleep_level(server, None)
    assert server._resolve_sleep_level() == 2
    with pytest.raises(ValueError, match="vLLM sleep level 3"):
        verl_compat.pin_sleep_level(server, 3)


def test_the_hf_server_keeps_its_weights_at_level_1_and_frees_them_at_level_2(tmp_path):
    import asyncio

    import torch

    from agent_system.cpu_backend.hf_server import HFRolloutServer
    from agent_system.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "model")
    server = HFRolloutServer(path, "float32", [0], 0, 64, 4, free_weights_on_sleep=True)
    before = {name: p.clone() for name, p in server.model.named_parameters()}

    async def sleep_and_wake(level):
        """(asleep after the sleep, asleep after the wake-up)."""
        verl_compat.pin_sleep_level(server, level)
        await server.sleep()
        verl_compat.pin_sleep_level(server, None)
        asleep = server.asleep
        await server.wake_up()
        return asleep, server.asleep

    async def both():
        kept = await sleep_and_wake(1)
        same = all(torch.equal(before[name], p) for name, p in server.model.named_parameters())
        return kept, same, await sleep_and_wake(None)

    kept, same, freed = asyncio.run(both())
    assert kept == (True, False) and same  # level 1: asleep, then awake with its weights, without a push
    assert freed == (True, True) and server.weights_freed  # level 2 (the server's own): only a push wakes it
    assert server.stats["sleeps"] == 2
