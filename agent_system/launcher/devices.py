"""The device a run is planned for: this machine's, or a GPU named by ``mlmt.plan_device`` on a machine without one.

    python -m verl.trainer.main_mlmt mlmt.plan_only=true mlmt.plan_device=h100-80 [key=value ...]

plans the run with the GPU settings (the YAML as it is, no CPU overlay) and :data:`PLAN_DEVICES`' memory for that
device, wherever it runs: a login node previews the plan of the GPU job it will submit. A run never uses
``mlmt.plan_device`` (it is refused without ``mlmt.plan_only``): a GPU run reads its device from the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from agent_system.config import ConfigError

PLAN_DEVICE_NAME_KEY = "mlmt.plan_device"


@dataclass(frozen=True)
class PlanDevice:
    """A GPU the plan can assume: its name in ``mlmt.plan_device``, the model it stands for, its memory."""

    name: str
    model: str
    gib: float  # the total torch reports for one device (CUDA's OOM messages: "a total capacity of ... GiB"), rounded
    # down: a little under the marketed size, as a real GPU's plan reads it (memory_estimate.device_memory)


# The one table of plannable devices (docs/RUN_PLAN.md, "Planning a GPU run on any machine").
PLAN_DEVICES = {
    device.name: device
    for device in (
        PlanDevice("h100-80", "NVIDIA H100 80GB", 79.1),
        PlanDevice("h200-141", "NVIDIA H200 141GB", 139.7),
        PlanDevice("a100-80", "NVIDIA A100 80GB", 79.1),
        PlanDevice("a100-40", "NVIDIA A100 40GB", 39.3),
        PlanDevice("l40s-48", "NVIDIA L40S 48GB", 44.4),
    )
}


def planned_device(config: DictConfig) -> PlanDevice | None:
    """``mlmt.plan_device``'s entry of :data:`PLAN_DEVICES` (None when unset).

    Raises:
        ConfigError: An unknown name (the message lists the known ones), or a name without ``mlmt.plan_only=true``.
    """
    name = config.mlmt.get("plan_device")
    if name is None:
        return None
    if str(name) not in PLAN_DEVICES:
        raise ConfigError(
            f"{PLAN_DEVICE_NAME_KEY}={name!r} is not a known device: use one of {', '.join(PLAN_DEVICES)} (or "
            "mlmt.plan_device_gib=<GiB> beside one of them for another memory size)"
        )
    if not config.mlmt.plan_only:
        raise ConfigError(
            f"{PLAN_DEVICE_NAME_KEY}={name} plans a GPU run without its GPU and is only for mlmt.plan_only=true: a run "
            f"reads its device from the GPU it gets; drop {PLAN_DEVICE_NAME_KEY} to run"
        )
    return PLAN_DEVICES[str(name)]


def plan_target(config: DictConfig) -> str:
    """The device the plan is for, in words: the named GPU, this machine's GPU 0, or the CPU backend."""
    from agent_system import verl_plugin

    device = planned_device(config)
    if device is not None:
        here = "planned on a machine without a GPU" if verl_plugin.CPU_BACKEND_ACTIVE else "planned on this machine"
        return f"{device.model} ({PLAN_DEVICE_NAME_KEY}={device.name}, {device.gib} GiB): the GPU settings, {here}"
    if verl_plugin.CPU_BACKEND_ACTIVE:
        return (
            "CPU (the CPU backend: mlmt-configs/overlays/cpu.yaml applied; "
            f"{PLAN_DEVICE_NAME_KEY}=<{'|'.join(PLAN_DEVICES)}> with mlmt.plan_only=true plans a GPU run here)"
        )
    import torch

    return f"GPU ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible on this node)"


def plans_a_gpu(config: DictConfig) -> bool:
    """Whether the plan is a GPU run's: a GPU is in use here, or ``mlmt.plan_device`` names one."""
    from agent_system import verl_plugin

    return not verl_plugin.CPU_BACKEND_ACTIVE or planned_device(config) is not None
