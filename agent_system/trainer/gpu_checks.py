"""Start-up checks and settings of the device path: failures a GPU run would meet late, turned into messages.

Each decision is a function of the facts it needs (Ray's free resources per node, whether ``flash_attn`` imports, ...)
passed as arguments, so it is unit-tested on a machine without a GPU; the thin readers of those facts sit beside it.

* :func:`check_pools_fit`: every resource pool of the run (both levels, the lagged snapshot, the ArCHer critic),
  counted together, against Ray's free resources per node. verl waits for a placement group with no time-out, so a
  pool that cannot be placed would otherwise hang the run without a message. On the CPU backend devices are ranks
  (one ``CPU`` slot each), so the same check runs in CI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig

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
