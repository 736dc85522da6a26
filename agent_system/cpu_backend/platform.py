"""A ``cpu`` platform for verl: device ``cpu``, collectives over ``gloo``, Ray resource ``CPU``.

verl 0.9.1 ships CUDA, NPU and ROCm platforms only and falls back to ``nvidia`` when no accelerator is found. This
platform is registered into verl's ``PlatformRegistry`` by :mod:`agent_system.verl_plugin` and selected with
``VERL_PLATFORM=cpu`` (set automatically when no GPU is visible).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch

from agent_system.verl_compat import PlatformBase


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the CUDA-style memory and naming calls verl makes on its device module.

    verl calls e.g. ``get_torch_device().memory_reserved()`` or ``.get_device_name()``; ``torch.cpu`` lacks them.
    Memory counters report 0 (host memory is not tracked per device), cache calls are no-ops.
    """

    def __init__(self) -> None:
        super().__init__("agent_system.cpu_backend.cpu_device")
        stubs = {
            "memory_reserved": _zero,
            "memory_allocated": _zero,
            "max_memory_allocated": _zero,
            "max_memory_reserved": _zero,
            "reset_peak_memory_stats": _noop,
            "empty_cache": _noop,
            "ipc_collect": _noop,
            "set_device": _noop,
            "manual_seed": torch.manual_seed,
            "get_rng_state": lambda *_a, **_k: torch.get_rng_state(),
            "set_rng_state": lambda state, *_a, **_k: torch.set_rng_state(state),
            "manual_seed_all": torch.manual_seed,
            "get_device_name": lambda *_a, **_k: "cpu",
            "mem_get_info": lambda *_a, **_k: (0, 0),
            "current_device": lambda: "cpu",
            "device_count": lambda: 1,
            "is_available": lambda: True,
        }
        for name, fn in stubs.items():
            setattr(self, name, fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = _CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform for machines without an accelerator (laptops, CI)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> str:
        # verl passes this straight to `.to(device=...)` / `torch.device(...)`; an int would mean an accelerator.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Each "GPU" slot of a verl resource pool is one CPU process here.
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        # vLLM-CPU: no thread pinning on small machines. The KV cache size comes from the CPU overlay
        # (engine_kwargs.vllm.kv_cache_memory_bytes) unless VLLM_CPU_KVCACHE_SPACE (GiB) is set.
        env = {
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            # with the overlay's distributed_executor_backend=uni, the model runs inside the engine-core process
            # instead of one more process per server (vLLM-CPU otherwise forces its multiprocess executor)
            "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        }
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ["VLLM_CPU_KVCACHE_SPACE"]
        return env

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
