"""verl plugin of MLMT-RL, loaded by ``import verl`` through the ``verl.plugins`` entry point (see setup.py).

It does four things, in every process that imports verl (driver, task runner, Ray workers):

1. makes the single module name ``verl.trainer.main_mlmt`` resolve to the repository's shim
   ``verl/trainer/main_mlmt.py`` (``import verl`` stays the PyPI package), so
   ``python -m verl.trainer.main_mlmt`` works from any directory;
2. registers the ``hf`` rollout backend (``rollout.name=hf``), a Hugging Face ``generate()`` server, and verl's
   vLLM rollout with per-level replica ranks (:mod:`agent_system.levels.level_rollout`), so two models' servers
   never share a name or a weight-transfer socket;
3. selects the project's ``cpu`` platform when ``VERL_PLATFORM=cpu`` or when no GPU is visible, and applies the
   CPU adjustments of :mod:`agent_system.verl_compat`. On a machine with GPUs nothing changes.

4. filters known library noise from the console (:mod:`agent_system.log_filter`).

verl logs plugin load failures only at DEBUG, so failures here are logged at ERROR before they propagate, and
``agent_system.verl_plugin.LOADED`` lets callers check that the plugin ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENTRY_MODULE = "verl.trainer.main_mlmt"
SHIM_PATH = Path(__file__).resolve().parent.parent / "verl" / "trainer" / "main_mlmt.py"
_ANNOUNCED_ENV = "MLMT_CPU_BACKEND_ANNOUNCED"

LOADED = False
CPU_BACKEND_ACTIVE = False


class _EntryModuleFinder(importlib.abc.MetaPathFinder):
    """Answers exactly ``verl.trainer.main_mlmt`` with the shim file; every other name falls through."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != ENTRY_MODULE:
            return None
        if not SHIM_PATH.is_file():
            raise ImportError(
                f"{ENTRY_MODULE} is provided by the MLMT-RL source tree, but {SHIM_PATH} does not exist. "
                "Install the project in editable mode from its repository: `pip install -e .`"
            )
        return importlib.util.spec_from_file_location(fullname, SHIM_PATH)


def gpu_visible() -> bool:
    """True when an NVIDIA GPU is visible to this machine (nvidia-smi) or to torch."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    try:
        if PlatformCUDA().is_platform_available(use_smi_check=True):
            return True
    except Exception:  # noqa: BLE001 - a broken nvidia-smi means "no usable GPU" here
        logger.debug("nvidia-smi check failed", exc_info=True)
    import torch

    return torch.cuda.is_available()


def cpu_backend_requested() -> bool:
    """The CPU backend is used when asked for (``VERL_PLATFORM=cpu``) or when no platform is set and no GPU is seen."""
    requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if requested:
        return requested == "cpu"
    return not gpu_visible()


def _activate_cpu_backend() -> None:
    from agent_system import verl_compat
    from agent_system.cpu_backend.platform import PlatformCPU

    resolved = verl_compat.platform_already_resolved()
    if resolved not in (None, "cpu"):
        raise RuntimeError(
            f"verl already resolved its platform to {resolved!r} before the MLMT-RL plugin loaded; "
            "set VERL_PLATFORM=cpu in the environment before starting Python."
        )
    verl_compat.register_platform("cpu", PlatformCPU)
    # Child processes (Ray workers) inherit the choice instead of probing again.
    os.environ["VERL_PLATFORM"] = "cpu"
    verl_compat.apply_cpu_adjustments()
    if not os.environ.get(_ANNOUNCED_ENV):
        os.environ[_ANNOUNCED_ENV] = "1"
        logger.warning("MLMT-RL: no GPU in use, verl runs on the project's CPU backend (VERL_PLATFORM=cpu).")


# rollout.name -> the module that holds its replica (driver side) and its in-worker server adapter. The classes are
# named, not imported: importing them here would load verl's rollout modules (and vLLM) in every process.
ROLLOUTS: dict[str, tuple[str, str, str]] = {
    "hf": ("agent_system.cpu_backend.hf_rollout", "HFRolloutReplica", "HFServerAdapter"),
    "vllm": ("agent_system.levels.level_rollout", "LevelvLLMReplica", "LevelServerAdapter"),
}


def _register_rollouts() -> None:
    from agent_system import verl_compat

    for name, (module, replica, adapter) in ROLLOUTS.items():
        verl_compat.register_rollout(name, replica=f"{module}.{replica}", adapter=f"{module}.{adapter}")


def _load() -> None:
    global LOADED, CPU_BACKEND_ACTIVE
    import sys

    from agent_system import log_filter, verl_compat

    log_filter.install()
    if not any(isinstance(finder, _EntryModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _EntryModuleFinder())
    _register_rollouts()
    verl_compat.register_value_head_loader()  # critics load with the attention their config selects (any platform)
    if cpu_backend_requested():
        _activate_cpu_backend()
        CPU_BACKEND_ACTIVE = True
    LOADED = True


try:
    _load()
except Exception:
    logger.exception(
        "The MLMT-RL verl plugin failed to load; verl continues without the CPU backend and the hf rollout. "
        "Reinstall with `bash scripts/install.sh` or see README.md, 'Troubleshooting'."
    )
    raise
