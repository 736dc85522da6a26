"""Every reach into verl 0.9.1 internals goes through this module, so a verl upgrade touches one file.

Two kinds of things live here:

* **Names** from verl's non-public modules (worker classes, rollout replica base classes, registries, the
  checkpoint engine manager...). They resolve lazily (PEP 562 ``__getattr__``) so that loading the project's verl
  plugin during ``import verl`` stays cheap.
* **CPU adjustments**, applied only when the project's ``cpu`` platform is active, each the smallest change that gets
  verl's unmodified FSDP2 engine running on a machine without an accelerator (docs/CPU.md):

  1. register the FSDP/FSDP2 LM-head and value-head engines for device ``cpu`` in ``EngineRegistry``;
  2. collapse the process-group backend ``"cpu:gloo,cpu:gloo"`` (which torch rejects as a duplicate) to ``"gloo"``;
  3. build FSDP2 ``CPUOffloadPolicy`` without pinned memory (pinning needs an accelerator);
  4. give Ray's accelerator-id lookup a ``CPU`` entry: verl's vLLM replica reads
     ``get_accelerator_ids()[<platform resource name>][0]`` in each worker to build the server's visible devices,
     and ``CPU`` is not a Ray accelerator (``KeyError: 'CPU'``). The entry lists one id, ``"0"``.

  They are applied after the target module is first imported (an import hook), never by editing verl's files.

* **The critic loader**, on every platform: ``verl.utils.model.load_valuehead_model`` hard-codes
  ``flash_attention_2`` (and, when that fails, says to install trl); the project's loader uses the attention the
  critic's config selects (``critic.model.override_config.attn_implementation``, verl's ``flash_attention_2`` when
  unset), so the SDPA fallback without flash-attn (``trainer.gpu_checks``) reaches the critic too.
* **The sleep level** of a level's rollout servers: verl 0.9.1 sleeps vLLM at level 2 (the weights discarded) unless
  LoRA or MTP needs level 1; :func:`sleep_replicas` asks for level 1 for a level whose weights the step does not
  change, so that its wake-up needs no push.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"

# name -> (module, attribute): verl names the project uses, resolved on first access.
# Nothing from verl is imported at module load: the plugin imports this module while ``import verl`` is running.
_LAZY_NAMES: dict[str, tuple[str, str]] = {
    "PlatformBase": ("verl.plugin.platform", "PlatformBase"),
    "PlatformRegistry": ("verl.plugin.platform", "PlatformRegistry"),
    "get_platform": ("verl.plugin.platform", "get_platform"),
    "ActorRolloutRefWorker": ("verl.workers.engine_workers", "ActorRolloutRefWorker"),
    "TrainingWorker": ("verl.workers.engine_workers", "TrainingWorker"),
    "register": ("verl.single_controller.base.decorator", "register"),
    "Dispatch": ("verl.single_controller.base.decorator", "Dispatch"),
    "RayWorkerGroup": ("verl.single_controller.ray", "RayWorkerGroup"),
    "RayResourcePool": ("verl.single_controller.ray", "RayResourcePool"),
    "RayClassWithInitArgs": ("verl.single_controller.ray", "RayClassWithInitArgs"),
    "create_colocated_worker_cls": ("verl.single_controller.ray.base", "create_colocated_worker_cls"),
    "LLMServerManager": ("verl.workers.rollout.llm_server", "LLMServerManager"),
    "CheckpointEngineManager": ("verl.checkpoint_engine", "CheckpointEngineManager"),
    "RolloutReplica": ("verl.workers.rollout.replica", "RolloutReplica"),
    "RolloutReplicaRegistry": ("verl.workers.rollout.replica", "RolloutReplicaRegistry"),
    "RolloutMode": ("verl.workers.rollout.replica", "RolloutMode"),
    "vLLMReplica": ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMReplica"),
    "vLLMServerAdapter": ("verl.workers.rollout.vllm_rollout", "ServerAdapter"),
    "TokenOutput": ("verl.workers.rollout.replica", "TokenOutput"),
    "BaseRollout": ("verl.workers.rollout.base", "BaseRollout"),
    "Tracking": ("verl.utils.tracking", "Tracking"),
    "omega_conf_to_dataclass": ("verl.utils.config", "omega_conf_to_dataclass"),
    "hf_tokenizer": ("verl.utils", "hf_tokenizer"),
    "get_device_name": ("verl.utils.device", "get_device_name"),
    "run_ppo": ("verl.trainer.main_ppo", "run_ppo"),
    "get_ppo_ray_runtime_env": ("verl.trainer.constants_ppo", "get_ppo_ray_runtime_env"),
    "tensordict_utils": ("verl.utils", "tensordict_utils"),
    "left_right_2_no_padding": ("verl.workers.utils.padding", "left_right_2_no_padding"),
    "no_padding_2_padding": ("verl.workers.utils.padding", "no_padding_2_padding"),
    "compute_position_id_with_mask": ("verl.utils.model", "compute_position_id_with_mask"),
    "TrainingWorkerConfig": ("verl.workers.engine_workers", "TrainingWorkerConfig"),
    "value_loss": ("verl.workers.utils.losses", "value_loss"),
    "ppo_loss": ("verl.workers.utils.losses", "ppo_loss"),
    "kl_penalty": ("verl.trainer.ppo.core_algos", "kl_penalty"),
    "agg_loss": ("verl.trainer.ppo.core_algos", "agg_loss"),
    "Metric": ("verl.utils.metric", "Metric"),
    "pad_dataproto_to_divisor": ("verl.protocol", "pad_dataproto_to_divisor"),
}

__all__ = [
    "VERL_VERSION",
    "after_import",
    "apply_cpu_adjustments",
    "register_platform",
    "register_rollout",
    "register_value_head_loader",
    *_LAZY_NAMES,
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attr = _LAZY_NAMES[name]
    return getattr(importlib.import_module(module_name), attr)


# --------------------------------------------------------------------------------------------------------------------
# Import hooks: run a callback on a verl module right after it is first imported.
# --------------------------------------------------------------------------------------------------------------------


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of selected modules to run callbacks after they execute."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _HookedLoader(spec.loader, self.hooks[fullname])
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)


_FINDER = _PostImportFinder()


def after_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once ``module_name`` is imported (at once if it already is)."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    _FINDER.hooks.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# --------------------------------------------------------------------------------------------------------------------
# Registrations (additive: they add names, they change nothing that exists)
# --------------------------------------------------------------------------------------------------------------------


def register_platform(name: str, platform_cls: type) -> None:
    __getattr__("PlatformRegistry").register(platform=name)(platform_cls)


def _load_class(dotted: str) -> type:
    module_name, _, class_name = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def register_rollout(name: str, *, replica: str, adapter: str) -> None:
    """Make ``rollout.name=<name>`` use the given replica (driver side) and server adapter (inside each worker).

    ``replica`` (a ``RolloutReplica``) and ``adapter`` (a ``BaseRollout``) are dotted ``"package.module.Class"``
    paths, imported on first use: registering costs nothing at ``import verl``. A name verl already has (``vllm``)
    is replaced; any other name is added to verl's two rollout registries.
    """
    for dotted in (replica, adapter):
        if "." not in dotted.strip("."):
            raise ValueError(f"register_rollout({name!r}): expected a 'package.module.Class' path, got {dotted!r}")

    def add_adapter(module: ModuleType) -> None:
        module._ROLLOUT_REGISTRY[(name, "async")] = adapter

    def add_replica(module: ModuleType) -> None:
        module.RolloutReplicaRegistry.register(name, lambda: _load_class(replica))

    after_import("verl.workers.rollout.base", add_adapter)
    after_import("verl.workers.rollout.replica", add_replica)


# --------------------------------------------------------------------------------------------------------------------
# CPU adjustments (only when the cpu platform is active)
# --------------------------------------------------------------------------------------------------------------------


def _register_cpu_engines(module: ModuleType) -> None:
    registry = importlib.import_module("verl.workers.engine.base").EngineRegistry
    registry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(module.FSDPEngineWithLMHead)
    registry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(module.FSDPEngineWithValueHead)

    offload_policy_cls = module.CPUOffloadPolicy
    if offload_policy_cls is not None:

        class UnpinnedCPUOffloadPolicy(offload_policy_cls):
            """FSDP2 CPU offload without pinned host memory (pinning requires an accelerator)."""

            def __init__(self, pin_memory: bool = False) -> None:
                super().__init__(pin_memory=False)

        module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _wrap_process_group_init(module: ModuleType) -> None:
    original = module.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        # verl builds "cpu:gloo,<device>:<backend>", which is "cpu:gloo,cpu:gloo" on CPU: torch rejects duplicates.
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    module.initialize_global_process_group_ray = initialize_global_process_group_ray


def load_valuehead_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
    """verl's critic loader with the attention of ``model_config`` (verl builds it from the critic's
    ``model.override_config.attn_implementation``) instead of a hard-coded ``flash_attention_2``."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
        trust_remote_code=trust_remote_code,
    )


def _config_value_head_loader(module: ModuleType) -> None:
    module.load_valuehead_model = load_valuehead_model


def register_value_head_loader() -> None:
    """Load critics with the attention their config selects, on every platform (module docstring)."""
    after_import("verl.utils.model", _config_value_head_loader)


def _cpu_accelerator_ids(module: ModuleType) -> None:
    context_cls = module.RuntimeContext
    original = context_cls.get_accelerator_ids
    if getattr(original, "adds_cpu", False):
        return

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {**original(self), "CPU": ["0"]}

    get_accelerator_ids.adds_cpu = True
    context_cls.get_accelerator_ids = get_accelerator_ids


def apply_cpu_adjustments() -> None:
    """Apply the CPU adjustments listed in the module docstring (idempotent per process)."""
    after_import("verl.workers.engine.fsdp.transformer_impl", _register_cpu_engines)
    after_import("verl.workers.engine_workers", _wrap_process_group_init)
    after_import("ray.runtime_context", _cpu_accelerator_ids)


def platform_already_resolved() -> str | None:
    """Device name of verl's platform singleton if something already resolved it, else None."""
    manager = importlib.import_module("verl.plugin.platform.platform_manager")
    current = manager._current_platform
    return None if current is None else current.device_name


# --------------------------------------------------------------------------------------------------------------------
# The rollout servers' sleep level
# --------------------------------------------------------------------------------------------------------------------

KEEP_WEIGHTS_SLEEP_LEVEL = 1  # vLLM's level-1 sleep: the weights go to host memory and come back at the wake-up


def pin_sleep_level(server: Any, level: int | None) -> None:
    """Make ``server`` (a rollout server object: verl's ``vLLMHttpServer``, the project's ``HFRolloutServer``) sleep
    at vLLM sleep ``level`` (1: the weights move to host memory and the wake-up restores them; 2: they are discarded)
    until called with None, which gives it back the level verl resolves.

    verl 0.9.1 has no per-call sleep level: its server sleeps at ``self._resolve_sleep_level()``, 2 unless the level
    serves a LoRA adapter or an MTP drafter. The pinned level is an attribute of the instance that shadows that
    method; it runs in the server's own process (:func:`sleep_replicas` sends it there through Ray)."""
    if level is None:
        vars(server).pop("_resolve_sleep_level", None)
        return
    if level not in (1, 2):
        raise ValueError(f"vLLM sleep level {level!r}: 1 (keep the weights in host memory) or 2 (discard them)")
    server._resolve_sleep_level = lambda: level


def sleep_replicas(checkpoint_manager: Any, keep_weights: bool) -> None:
    """Sleep the rollout servers of ``checkpoint_manager`` (verl's ``CheckpointEngineManager``) to free their devices.

    ``keep_weights``: at :data:`KEEP_WEIGHTS_SLEEP_LEVEL`, for a level whose weights do not change before the next
    generation: ``checkpoint_manager.wake_up_replicas()`` then brings them back without a push. Otherwise at the level
    verl picks (2, which discards the weights, so that only a push makes the servers usable again)."""
    if not keep_weights:
        checkpoint_manager.sleep_replicas()
        return
    import ray

    servers = [server for replica in checkpoint_manager.replicas for server in replica.servers]
    ray.get([server.__ray_call__.remote(pin_sleep_level, KEEP_WEIGHTS_SLEEP_LEVEL) for server in servers])
    try:
        checkpoint_manager.sleep_replicas()
    finally:
        ray.get([server.__ray_call__.remote(pin_sleep_level, None) for server in servers])


# --------------------------------------------------------------------------------------------------------------------
# Checkpoint export
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergedCheckpoint:
    """What :func:`merge_fsdp_checkpoint` wrote: ``folder``; ``adapter``, verl's PEFT adapter folder of a LoRA actor
    (else None); ``base_weights``, whether ``folder`` holds model weights (False for an adapters-only checkpoint)."""

    folder: str
    adapter: str | None
    base_weights: bool


def rollout_router(server_manager: Any) -> Any:
    """The Ray actor that routes an ``LLMServerManager``'s requests to its servers (``global_load_balancer``).

    verl creates it without waiting for its process to start (a fresh interpreter that imports verl)."""
    return server_manager.global_load_balancer


def merge_fsdp_checkpoint(local_dir: str, target_dir: str) -> MergedCheckpoint:
    """Merge a verl FSDP actor checkpoint folder into a Hugging Face model folder with verl's model merger.

    * full fine-tuning: ``target_dir`` is the trained model;
    * LoRA (``model.lora_rank`` > 0): ``target_dir`` holds the base weights without the adapter (verl strips the
      ``lora_`` tensors and renames ``base_layer`` back), and ``target_dir/lora_adapter`` the adapter as a PEFT
      folder (``adapter_config.json`` from ``lora_train_meta.json``, ``adapter_model.safetensors``);
    * adapters only (``actor.checkpoint.save_lora_only``, no base weights in the shards): only
      ``target_dir/lora_adapter``. verl's merger would write the adapter and then fail its check of a complete model
      folder; here the adapter is all it writes.

    Every tensor is bfloat16, as verl's merger casts them.
    """
    base = importlib.import_module("verl.model_merger.base_model_merger")
    merger_cls = importlib.import_module("verl.model_merger.fsdp_model_merger").FSDPModelMerger
    manager_cls = importlib.import_module("verl.utils.checkpoint.checkpoint_manager").BaseCheckpointManager
    wrote = {"adapter": None, "base_weights": True}

    class Merger(merger_cls):
        def save_lora_adapter(self, state_dict: dict) -> str | None:
            wrote["adapter"] = super().save_lora_adapter(state_dict)
            return wrote["adapter"]

        def save_hf_model_and_tokenizer(self, state_dict: dict) -> None:
            if manager_cls.is_lora_only_state_dict(state_dict):  # verl's own test for an adapters-only checkpoint
                wrote["base_weights"] = False
                self.save_lora_adapter(state_dict)
                return
            super().save_hf_model_and_tokenizer(state_dict)

    config = base.ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=local_dir,
        target_dir=target_dir,
        hf_model_config_path=f"{local_dir}/huggingface",
    )
    Merger(config).merge_and_save()
    return MergedCheckpoint(folder=target_dir, **wrote)


# --------------------------------------------------------------------------------------------------------------------
# Defaults of verl's config (the start-up checks refuse verl keys this trainer does not read: verl_keys.py)
# --------------------------------------------------------------------------------------------------------------------


@functools.cache
def verl_default_config() -> Any:
    """verl's composed default ``ppo_trainer`` config (the ``_generated_ppo_trainer.yaml`` verl ships beside its
    Hydra configs), read once: the defaults the trainer's checks compare verl's own keys with."""
    from pathlib import Path

    import verl.trainer.config
    from omegaconf import OmegaConf

    return OmegaConf.load(Path(verl.trainer.config.__file__).parent / "_generated_ppo_trainer.yaml")


# --------------------------------------------------------------------------------------------------------------------
# Learning-rate schedules (the run plan computes the lr each update gets)
# --------------------------------------------------------------------------------------------------------------------


def build_lr_scheduler(optimizer_config: Any, optimizer: Any) -> Any:
    """The learning-rate scheduler verl's FSDP engine builds for ``optimizer`` from ``optimizer_config`` (an
    ``FSDPOptimizerConfig``): the engine's own ``_build_lr_scheduler``, called on a stand-in holding the two
    attributes it reads. verl's workers step it once per ``update_actor`` / ``train_mini_batch`` call."""
    from types import SimpleNamespace

    engine = importlib.import_module("verl.workers.engine.fsdp.transformer_impl").FSDPEngine
    return engine._build_lr_scheduler(SimpleNamespace(optimizer_config=optimizer_config, rank=1), optimizer)
