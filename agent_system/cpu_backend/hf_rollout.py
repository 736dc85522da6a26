"""verl glue for the ``hf`` rollout backend: a ``RolloutReplica`` that launches :class:`HFRolloutServer` actors and
the in-worker adapter that pushes the actor's weights to them.

Selected with ``actor_rollout_ref.rollout.name=hf`` (registered by :mod:`agent_system.verl_plugin`). One replica
per actor rank (``tensor_model_parallel_size`` must be 1), on that rank's device (its GPU where Ray gave the rank one,
else the CPU: :func:`server_options`): each rank's adapter drains the FSDP full-state generator
(a collective, so every rank takes part) and sends the full state dict to its own server. verl's
``CheckpointEngineManager(backend="naive")`` drives this through ``ActorRolloutRefWorker.update_weights``.

Two models in one driver (HL and LL) get distinct server names from the owning worker's Ray actor id; when both
models share worker processes (fused ``colocated`` placement), ``rollout.custom.server_tag`` tells them apart.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agent_system.cpu_backend.hf_server import HFRolloutServer
from agent_system.multi_turn_rollout.stopping import stop_tokens
from agent_system.verl_compat import BaseRollout, RolloutReplica

logger = logging.getLogger(__name__)


def server_name(rollout_config: Any, worker_actor_id: str) -> str:
    """Ray actor name of the hf server serving the worker with this actor id."""
    tag = (getattr(rollout_config, "custom", None) or {}).get("server_tag", "")
    return f"mlmt_hf_server_{tag}_{worker_actor_id}"


# Ray clears CUDA_VISIBLE_DEVICES in an actor that asks for no GPU; the server asks for none (its worker holds the GPU)
# and sets the worker's devices itself, as verl's vLLM server does
_RAY_KEEP_CUDA_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def server_options(gpu_ids: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Ray options and the extra init arguments of the hf server of a worker that Ray gave ``gpu_ids`` (its
    ``get_accelerator_ids()["GPU"]``): with GPUs, the server generates on them (``cuda_visible_devices``); without,
    on the CPU, in Ray's default worker environment."""
    if not gpu_ids:
        return {}, {}
    return {"runtime_env": {"env_vars": {_RAY_KEEP_CUDA_DEVICES: "1"}}}, {"cuda_visible_devices": ",".join(gpu_ids)}


def _check_world_size(config: Any) -> None:
    world = config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size
    if world != 1:
        raise ValueError(
            "rollout.name=hf serves one replica per actor rank: set rollout.tensor_model_parallel_size=1, "
            f"data_parallel_size=1 and pipeline_model_parallel_size=1 (got a rollout world size of {world})."
        )


def _server_init_args(config: Any, model_config: Any, replica_rank: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    path = model_config.path if hasattr(model_config, "path") else model_config["path"]
    tokenizer_path = getattr(model_config, "tokenizer_path", None) or path
    eos, pad = stop_tokens(path, AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=False))
    max_model_len = config.max_model_len or (config.prompt_length + config.response_length)
    return {
        "model_path": path,
        "dtype": config.dtype,
        "eos_token_ids": eos,
        "pad_token_id": pad,
        "max_model_len": max_model_len,
        "default_max_tokens": config.response_length,
        "options": dict(config.engine_kwargs.get("hf", None) or {}),
        "seed": config.seed + replica_rank,  # as verl seeds its vLLM servers
        "free_weights_on_sleep": bool(config.free_cache_engine),
    }


class HFRolloutReplica(RolloutReplica):
    """A rollout replica served by one :class:`HFRolloutServer` actor next to its actor worker."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        _check_world_size(self.config)
        worker = self.workers[0]
        node_id, actor_id, gpu_ids = await worker.__ray_call__.remote(
            lambda self: (
                ray.get_runtime_context().get_node_id(),
                ray.get_runtime_context().get_actor_id(),
                list(ray.get_runtime_context().get_accelerator_ids().get("GPU", [])),
            )
        )
        name = server_name(self.config, actor_id)
        device_options, device_args = server_options(gpu_ids)
        server = (
            ray.remote(HFRolloutServer)
            .options(
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                **device_options,
            )
            .remote(**_server_init_args(self.config, self.model_config, self.replica_rank), **device_args)
        )
        await server.get_stats.remote()  # surfaces model-loading errors here, not at the first generate
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}"


class HFServerAdapter(BaseRollout):
    """Rollout adapter inside ``ActorRolloutRefWorker``: forwards weight updates to this rank's hf server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        _check_world_size(self.config)
        self._server_name = server_name(self.config, ray.get_runtime_context().get_actor_id())
        self._server = None

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"rollout.name=hf supports wire_format=named_tensors only, got {wire_format!r}")
        # Every rank drains the generator: producing full tensors from FSDP shards is a collective.
        if hasattr(weights, "__aiter__"):
            state_dict = {name: tensor.detach().to("cpu") async for name, tensor in weights}
        else:
            state_dict = {name: tensor.detach().to("cpu") for name, tensor in weights}
        if self._server is None:
            self._server = ray.get_actor(self._server_name)
        await self._server.update_weights.remote(state_dict, kwargs.get("global_steps"))
