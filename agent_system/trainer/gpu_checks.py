"""Start-up checks and settings of the device path: failures a GPU run would meet late, turned into messages.

Each decision is a function of the facts it needs (Ray's free resources per node, whether ``flash_attn`` imports, ...)
passed as arguments, so it is unit-tested on a machine without a GPU; the thin readers of those facts sit beside it.

* :func:`check_pools_fit`: every resource pool of the run (both levels, the lagged snapshot, the ArCHer critic),
  counted together, against Ray's free resources per node. verl waits for a placement group with no time-out, so a
  pool that cannot be placed would otherwise hang the run without a message. On the CPU backend devices are ranks
  (one ``CPU`` slot each), so the same check runs in CI.

:func:`prepare_devices` (called by ``main.prepare_config`` after validation, before Ray starts) applies the rest:

* :func:`attention_fallback`: on a GPU node where ``flash_attn`` does not import, every model (actor, reference and
  critic of both levels) loads with ``sdpa`` and ``use_remove_padding=false``, the path CI runs; with flash-attn,
  verl's default (``flash_attention_2``, packed sequences) is kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

from agent_system.trainer.config import ConfigError, has_hl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demand:
    """One placement group (or single actor) the run asks Ray for: all of ``resources`` on one node."""

    what: str  # e.g. "LL pool (mlmt.ll_gpus=4), node 1 of 2"
    resources: dict[str, float]


def pool_demands(config: DictConfig, device_resource: str) -> list[Demand]:
    """What the run's resource pools ask Ray for, one entry per placement group (each one node, STRICT_PACK).

    A pool process takes one ``CPU`` and one ``device_resource`` slot (verl's bundle ``{"CPU": 1, <device>: 1}``; on
    the CPU backend the device resource is ``CPU`` itself, so one slot). Pools: the two levels (``split``) or the
    shared one (``colocated``), the lagged snapshot's (``mlmt.reward.contrastive_reference=lagged_snapshot``, shaped
    like the LL's) and the ArCHer critic's actor (``mlmt.archer.num_gpus`` devices, no CPU slot).
    """
    from agent_system.trainer.placement import level_nodes

    def bundle(processes: int) -> dict[str, float]:
        return {"CPU": float(processes), device_resource: float(processes)}

    def pool(name: str, nodes: list[int]) -> list[Demand]:
        return [
            Demand(f"{name}, node {i + 1} of {len(nodes)}" if len(nodes) > 1 else name, bundle(count))
            for i, count in enumerate(nodes)
        ]

    mlmt, trainer = config.mlmt, config.trainer
    demands: list[Demand] = []
    if mlmt.placement == "split":
        for level in ("ll", "hl") if has_hl(config) else ("ll",):
            demands += pool(
                f"{level.upper()} pool (mlmt.{level}_gpus={mlmt[f'{level}_gpus']})", level_nodes(config, level)
            )
    else:
        shared = f"shared pool (mlmt.placement=colocated, trainer.n_gpus_per_node={trainer.n_gpus_per_node})"
        demands += pool(shared, [trainer.n_gpus_per_node] * trainer.nnodes)
    reward = mlmt.reward
    if has_hl(config) and reward.hl_reward == "contrastive" and reward.contrastive_reference == "lagged_snapshot":
        snapshot = (
            f"lagged snapshot pool (mlmt.reward.contrastive_reference=lagged_snapshot, mlmt.ll_gpus={mlmt.ll_gpus})"
        )
        demands += pool(snapshot, level_nodes(config, "ll"))
    if mlmt.ll.adv_estimator == "archer" and mlmt.archer.num_gpus > 0:
        demands.append(
            Demand(f"ArCHer critic (mlmt.archer.num_gpus={mlmt.archer.num_gpus})", {"GPU": float(mlmt.archer.num_gpus)})
        )
    return demands


def unplaceable(demands: list[Demand], free: dict[str, dict[str, float]]) -> bool:
    """Whether ``demands`` cannot all be placed, each on one node, on nodes with ``free`` resources ``{node: {...}}``.

    An exact search (a handful of pools and nodes), largest demand first.
    """
    order = sorted(demands, key=lambda d: -sum(d.resources.values()))
    nodes = [dict(resources) for resources in free.values()]

    def place(index: int) -> bool:
        if index == len(order):
            return True
        need = order[index].resources
        tried: set[tuple] = set()
        for node in nodes:
            key = tuple(sorted(node.items()))
            if key in tried or any(node.get(name, 0.0) + 1e-9 < amount for name, amount in need.items()):
                continue
            tried.add(key)
            for name, amount in need.items():
                node[name] = node.get(name, 0.0) - amount
            if place(index + 1):
                return True
            for name, amount in need.items():
                node[name] += amount
        return False

    return not place(0)


def pools_fit_message(demands: list[Demand], free: dict[str, dict[str, float]], device_resource: str) -> str | None:
    """None when every demand can be placed, else a message giving what was asked and what the cluster has."""
    if not unplaceable(demands, free):
        return None
    names = sorted({name for d in demands for name in d.resources} | {device_resource})
    asked = "; ".join(
        f"{d.what}: {', '.join(f'{d.resources[n]:g} {n}' for n in names if n in d.resources)}" for d in demands
    )
    total = {n: sum(d.resources.get(n, 0.0) for d in demands) for n in names}
    has = "; ".join(
        f"node {node}: {', '.join(f'{resources.get(n, 0.0):g} {n}' for n in names)}" for node, resources in free.items()
    )
    unit = "device (GPU)" if device_resource == "GPU" else f"rank ({device_resource} slot)"
    return (
        f"the run's resource pools do not fit the Ray cluster, and verl would wait for them forever. Asked (each line "
        f"on one node; one {unit} per process): {asked}; in all {', '.join(f'{total[n]:g} {n}' for n in names)}. "
        f"The cluster has {len(free)} alive node(s) with free: {has}. Lower mlmt.ll_gpus / mlmt.hl_gpus (split) or "
        "trainer.n_gpus_per_node / trainer.nnodes (colocated), drop the lagged snapshot "
        "(mlmt.reward.contrastive_reference) or mlmt.archer.num_gpus, or start Ray with more resources "
        "(ray_kwargs.ray_init.num_cpus on the CPU backend; more nodes on a cluster)"
    )


def free_resources_per_node() -> dict[str, dict[str, float]]:
    """Ray's free resources of every alive node, ``{node address: {resource: amount}}`` (Ray must be initialised)."""
    import ray
    from ray._private.state import available_resources_per_node

    address = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    return {
        f"{address[node]} ({node[:8]})": {k: float(v) for k, v in resources.items()}
        for node, resources in available_resources_per_node().items()
        if node in address
    }


def check_pools_fit(config: DictConfig) -> None:
    """Fail in seconds when the run's pools cannot be placed on the Ray cluster (module docstring).

    Raises:
        ConfigError: What was asked, key by key, and what each node has free.
    """
    from agent_system import verl_compat as vc

    device_resource = vc.get_platform().ray_resource_name()
    message = pools_fit_message(pool_demands(config, device_resource), free_resources_per_node(), device_resource)
    if message:
        raise ConfigError(message)


# The model sections verl reads attention and padding from: actor and reference share ``<tree>.model``.
MODEL_SECTIONS = ("actor_rollout_ref.model", "hl.model", "critic.model", "hl_critic.model")


def flash_attn_importable() -> tuple[bool, str]:
    """Whether ``import flash_attn`` works here, and why not (a wheel built for another torch fails on import)."""
    try:
        import flash_attn  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means verl's flash_attention_2 cannot load
        return False, f"{type(error).__name__}: {error}"
    return True, ""


def attention_fallback(config: DictConfig, on_gpu: bool, flash_attn: bool) -> list[str]:
    """Without flash-attn on a GPU: ``sdpa`` and ``use_remove_padding=false`` for every model; returns the keys set.

    verl loads models with ``flash_attention_2`` when ``model.override_config.attn_implementation`` is unset and
    packs sequences (``use_remove_padding=true``); SDPA on packed sequences has never run here, SDPA on padded ones is
    what CI runs. An explicit ``flash_attention_2`` cannot load and is rejected; another explicit choice is kept.

    Raises:
        ConfigError: ``<section>.override_config.attn_implementation=flash_attention_2`` without flash-attn.
    """
    if not on_gpu or flash_attn:
        return []
    changed = []
    with open_dict(config):
        for section in MODEL_SECTIONS:
            model = OmegaConf.select(config, section)
            attention = (model.get("override_config") or {}).get("attn_implementation")
            if attention == "flash_attention_2":
                raise ConfigError(
                    f"{section}.override_config.attn_implementation=flash_attention_2, but flash_attn does not import "
                    "on this node: install flash-attn (README, GPU install), or leave the key unset to use sdpa"
                )
            if attention is None:
                OmegaConf.update(config, f"{section}.override_config.attn_implementation", "sdpa", force_add=True)
                changed.append(f"{section}.override_config.attn_implementation=sdpa")
            if model.use_remove_padding:
                model.use_remove_padding = False
                changed.append(f"{section}.use_remove_padding=false")
    return changed


def prepare_devices(config: DictConfig, user_overrides: list[str]) -> None:
    """Device settings and start-up checks of a run (module docstring), before any worker starts.

    Raises:
        ConfigError: A setting that cannot work on these devices; the message names the keys.
    """
    from agent_system import verl_plugin

    on_gpu = not verl_plugin.CPU_BACKEND_ACTIVE
    if on_gpu:
        flash_attn, reason = flash_attn_importable()
        changed = attention_fallback(config, on_gpu, flash_attn)
        if changed:
            logger.warning(
                "flash_attn does not import (%s): actor, reference and critic models of both levels load with sdpa "
                "and unpacked sequences (%s), the path CI runs; install flash-attn for verl's default",
                reason,
                ", ".join(changed),
            )
