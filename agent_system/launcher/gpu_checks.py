"""Start-up checks and settings of the device path: failures a GPU run would meet late, turned into messages.

Each decision is a function of the facts it needs (Ray's free resources per node, whether ``flash_attn`` imports, ...)
passed as arguments, so it is unit-tested on a machine without a GPU; the thin readers of those facts sit beside it.

* :func:`check_pools_fit_nodes`: before Ray, the same pools against the job's nodes (``trainer.nnodes`` of
  ``trainer.n_gpus_per_node`` devices, or of the GPUs this node sees): a pool larger than the nodes can hold is refused
  by the run plan, by name, instead of by Ray after it starts.
* :func:`check_pools_fit`: every resource pool of the run (both levels, the lagged snapshot, the ArCHer critic),
  counted together, against Ray's free resources per node. verl waits for a placement group with no time-out, so a
  pool that cannot be placed would otherwise hang the run without a message. On the CPU backend devices are ranks
  (one ``CPU`` slot each), so the same check runs in CI.
* :func:`idle_devices_notice`: a run-plan notice (not a refusal) when those pools use fewer devices than the job
  has (``trainer.nnodes`` × ``trainer.n_gpus_per_node``, or the GPUs visible on this node when more): the defaults
  use 2 devices of an 8-GPU node.
* :func:`check_paths_on_every_node`: on a cluster of several nodes, the model folders (resolved on the driver's node:
  a hub name becomes a folder of the driver's cache) and ``trainer.default_local_dir`` must be visible from every
  node, or a worker fails to load its model (or a resume misses shards); the message says to use shared storage.

:func:`prepare_devices` (called by ``main.prepare_config`` after validation, before Ray starts) applies the rest:

* :func:`attention_fallback`: on a GPU node where ``flash_attn`` does not import, every model (actor, reference and
  critic of both levels) loads with ``sdpa`` and ``use_remove_padding=false``, the path CI runs; with flash-attn,
  verl's default (``flash_attention_2``, packed sequences) is kept.
* :func:`rollout_memory`: under colocated placement both levels' vLLM engines are awake at once on every device, so
  each level's ``rollout.gpu_memory_utilization`` defaults to :data:`COLOCATED_SHARE` (verl's 0.5 twice, plus two
  actors, does not fit) and a sum above :data:`COLOCATED_TOTAL` is refused; every level's ``rollout.max_model_len``
  defaults to its prompt budget plus its response budget (unset, vLLM reserves KV cache for the model's whole
  context, e.g. 131,072 tokens).
* :func:`check_replica_sizes`: a vLLM replica (``tensor × data × pipeline_model_parallel_size`` devices) larger than
  ``trainer.n_gpus_per_node`` would be launched by verl as a multi-node vLLM on one host; a level whose devices are
  not a whole number of replicas would leave devices without a server. Both are refused by name.
* :func:`merge_ray_runtime_env`: the Ray runtime environment verl's own trainer gives its workers
  (``get_ppo_ray_runtime_env``: ``VLLM_DISABLE_COMPILE_CACHE=1`` against vLLM's compile-cache corruption when
  replicas compile at once, NCCL and vLLM log levels, ...) goes under ``ray_kwargs.ray_init.runtime_env.env_vars``;
  the user's values there, and the three ``main.run_mlmt`` sets, win.
* :func:`driver_message`: the project detects a GPU with ``nvidia-smi``; when torch cannot use it (the GPU sets'
  torch wheels, 2.11.0 and 2.13.0, are built for CUDA 13 and need an NVIDIA driver R580 or newer), the run stops
  here with the driver's and torch's CUDA versions and the fix, instead of deep inside a worker.
* :func:`check_compile_keys`: verl 0.9.1's FSDP engine compiles the entropy computation when
  ``<role>.fsdp_config.use_torch_compile`` is true and never reads ``<role>.use_torch_compile``; a value of the
  latter that differs from the former would not act, and is refused by name.

The per-device memory estimate (item 9 of the GPU issue) is part of the run plan
(:mod:`agent_system.launcher.memory_estimate`): ``main.preflight`` logs it at start-up, before Ray. On a GPU it first
lowers the token budgets of padded passes (no flash-attn) to what fits with the estimate's margin
(:func:`lower_padded_budgets`), then refuses a run whose estimated peak still exceeds a device less that margin,
unless ``mlmt.plan_allow_overcommit``. Here ``mlmt.plan_device_gib``
is checked with the other device settings.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

from agent_system import methods
from agent_system.config import CRITIC_TREES, ConfigError, has_hl, level_view
from agent_system.launcher.memory_estimate import MemoryPlan, device_memory_setting, padded_budgets
from agent_system.trainer.advantages import critic_levels

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
    like the LL's) and the selected methods' own actors (``methods.resource_demands``: ArCHer's critic).
    """
    from agent_system.config import level_nodes

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
    return demands + [Demand(name, resources) for name, resources in methods.resource_demands(config)]


def idle_devices_notice(config: DictConfig, visible: int | None) -> str | None:
    """A start-up notice when the run's pools use fewer devices than the job has; None when they use them all.

    The job has ``trainer.nnodes`` nodes of ``trainer.n_gpus_per_node`` devices, or of the GPUs visible on this node
    (``visible``; None on the CPU backend) when there are more. The pools: :func:`pool_demands` (both levels or the
    shared pool, the lagged snapshot, the ArCHer critic).
    """
    trainer, mlmt = config.trainer, config.mlmt
    used = int(sum(demand.resources.get("GPU", 0.0) for demand in pool_demands(config, "GPU")))
    per_node = max(int(trainer.n_gpus_per_node), visible or 0)
    has = per_node * int(trainer.nnodes)
    if used >= has:
        return None
    seen = bool(visible and visible > trainer.n_gpus_per_node)  # this node has more GPUs than the config says
    node = f"{visible} GPUs visible on this node" if seen else f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}"
    per_node_key = f" with trainer.n_gpus_per_node={per_node}" if seen else ""
    if mlmt.placement == "split":
        levels = ("ll", "hl") if has_hl(config) else ("ll",)
        sizes = " / ".join(f"mlmt.{level}_gpus (now {mlmt[f'{level}_gpus']})" for level in levels)
        fix = f"raise {sizes}, or use mlmt.placement=colocated{per_node_key}"
    else:
        fix = f"set trainer.n_gpus_per_node={per_node}"
    nodes, exact = int(trainer.nnodes), used // int(trainer.nnodes)
    if nodes > 1 and not seen and used % nodes == 0 and exact < trainer.n_gpus_per_node:  # the key set to a pool's size
        fix = (
            f"set trainer.n_gpus_per_node={exact} if each node has {exact} devices (the key counts the devices of one "
            f"node, not of a pool or of the job), else {fix}"
        )
    return (
        f"GPUs: the resource pools use {used} of the job's {has} devices (trainer.nnodes={trainer.nnodes} × {node}): "
        f"{has - used} stay idle; {fix}" + (", or hide them from the job (CUDA_VISIBLE_DEVICES)" if seen else "")
    )


def check_pools_fit_nodes(config: DictConfig, visible: int | None) -> None:
    """Before Ray starts: the run's pools (:func:`pool_demands`, each on one node) fit the job's ``trainer.nnodes``
    nodes of ``visible`` GPUs each (this node's; ``trainer.n_gpus_per_node`` where none is visible, as when
    ``mlmt.plan_device`` plans a GPU run without one). :func:`check_pools_fit` checks Ray's own count once it runs.

    Raises:
        ConfigError: Names each pool's key and size, and the job's nodes and devices.
    """
    trainer = config.trainer
    per_node = visible or int(trainer.n_gpus_per_node)
    demands = [Demand(d.what, {"GPU": d.resources.get("GPU", 0.0)}) for d in pool_demands(config, "GPU")]
    if not unplaceable(demands, {str(i): {"GPU": float(per_node)} for i in range(int(trainer.nnodes))}):
        return
    node = f"{visible} GPUs visible on this node" if visible else f"trainer.n_gpus_per_node={per_node}"
    asked = "; ".join(f"{d.what}: {d.resources['GPU']:g}" for d in demands if d.resources["GPU"])
    raise ConfigError(
        f"the run's resource pools do not fit the job's devices (trainer.nnodes={trainer.nnodes} × {node}), each pool "
        f"on one node: {asked}. Set trainer.nnodes and trainer.n_gpus_per_node to the job's nodes and the devices of "
        "each, or lower the pools (mlmt.ll_gpus / mlmt.hl_gpus under split, mlmt.archer.num_gpus)"
    )


def visible_gpus() -> int | None:
    """GPUs visible to this process (None on the CPU backend)."""
    from agent_system import verl_plugin

    if verl_plugin.CPU_BACKEND_ACTIVE:
        return None
    import torch

    return torch.cuda.device_count()


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


def model_path_keys(config: DictConfig) -> list[str]:
    """The keys of the models the run loads: each level's policy (the HL's when it runs), the critic of each level
    in ``advantages.critic_levels``, and those of the selected methods and plug-ins (``model_path_keys``)."""
    keys = ["actor_rollout_ref.model.path"] + (["hl.model.path"] if has_hl(config) else [])
    keys += [f"{CRITIC_TREES[level]}.model.path" for level in critic_levels(config)]
    return keys + methods.model_path_keys(config)


def shared_paths(config: DictConfig) -> dict[str, str]:
    """The folders every node's workers read or write: model paths in use and ``trainer.default_local_dir``."""
    paths = {key: os.path.abspath(str(OmegaConf.select(config, key))) for key in model_path_keys(config)}
    paths["trainer.default_local_dir"] = os.path.abspath(str(config.trainer.default_local_dir))
    return paths


def invisible_paths_message(missing: dict[str, list[str]]) -> str | None:
    """None when every node sees every path, else which node misses which ``key=path``, and the fix."""
    missing = {node: entries for node, entries in missing.items() if entries}
    if not missing:
        return None
    where = "; ".join(f"node {node} does not see {', '.join(entries)}" for node, entries in missing.items())
    return (
        f"{where}. Every node's workers load the models and write checkpoints there: put model folders and "
        "trainer.default_local_dir on shared storage that every node mounts (for a hub name, set HF_HOME to a shared "
        "folder, or download the model to one and pass its path)"
    )


def paths_missing_on_nodes(paths: dict[str, str], timeout_s: float = 120.0) -> dict[str, list[str]]:
    """Per alive Ray node, the ``key=path`` entries of ``paths`` that do not exist there (one zero-CPU task a node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def missing(entries: dict[str, str]) -> list[str]:
        return [f"{key}={path}" for key, path in entries.items() if not os.path.exists(path)]

    task = ray.remote(num_cpus=0)(missing)
    nodes = {node["NodeManagerAddress"]: node["NodeID"] for node in ray.nodes() if node["Alive"]}
    refs = {
        address: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(paths)
        for address, node_id in nodes.items()
    }
    return dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s), strict=True))


def check_paths_on_every_node(config: DictConfig) -> None:
    """On a cluster of several nodes: every node sees the model folders and the output folder (module docstring).

    Raises:
        ConfigError: Which node misses which key's path; says to use shared storage.
    """
    import ray

    if sum(node["Alive"] for node in ray.nodes()) < 2:
        return
    message = invisible_paths_message(paths_missing_on_nodes(shared_paths(config)))
    if message:
        raise ConfigError(message)


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


def lower_padded_budgets(config: DictConfig, memory: MemoryPlan) -> list[str]:
    """Set the token budgets :func:`~agent_system.launcher.memory_estimate.padded_budgets` lowers to keep each padded
    pass within the device less ``memory_estimate.MARGIN`` (a log-prob budget, in tokens or rows, also caps the
    level's reference, which runs the same pass); returns the ``key=value`` settings made.

    Each key's value is read as the level's workers receive it, in its view (:func:`~agent_system.config.level_view`):
    verl's default ``<tree>.ref.log_prob_max_token_len_per_gpu`` interpolates
    ``actor_rollout_ref.actor.ppo_max_token_len_per_gpu``, the LL's in the full config, the level's own in its view.
    """
    changed = []
    for key, budget in padded_budgets(memory).items():
        keys = [key]
        if ".rollout.log_prob_" in key:
            keys.append(key.replace(".rollout.", ".ref."))
        for name in keys:
            tree, path = name.split(".", 1)
            view = level_view(config, "hl" if tree == "hl" else "ll")  # made again: a key set before may change it
            if (OmegaConf.select(view.actor_rollout_ref, path, default=None) or 0) > budget:
                OmegaConf.update(config, name, budget, merge=False)
                changed.append(f"{name}={budget}")
    return changed


COLOCATED_SHARE = 0.35  # per level, of each device
COLOCATED_TOTAL = 0.7  # both levels' engines; the rest of the device holds both levels' actor (and critic) processes
POLICY_TREES = ("actor_rollout_ref", "hl")


def override_keys(user_overrides: list[str]) -> set[str]:
    """The config keys set on the command line (``key=value``, ``+key=value``, ``++key=value``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {
        override.key_or_group
        for override in OverridesParser.create().parse_overrides(user_overrides)
        if not override.is_delete() and not override.key_or_group.startswith("hydra")
    }


def rollout_memory(config: DictConfig, user_keys: set[str]) -> list[str]:
    """vLLM memory settings of both levels (module docstring); returns the keys set.

    Raises:
        ConfigError: Under colocated placement the two levels' ``gpu_memory_utilization`` sum above
            :data:`COLOCATED_TOTAL`, or a ``max_model_len`` is below the level's prompt + response budget.
    """
    trees = POLICY_TREES if has_hl(config) else POLICY_TREES[:1]
    changed = []
    for tree in trees:
        rollout = config[tree].rollout
        budget = rollout.prompt_length + rollout.response_length
        if rollout.max_model_len is None:
            rollout.max_model_len = budget
            changed.append(f"{tree}.rollout.max_model_len={budget}")
        elif rollout.max_model_len < budget:
            raise ConfigError(
                f"{tree}.rollout.max_model_len={rollout.max_model_len} is below the level's prompt budget + response "
                f"budget ({tree}.rollout.prompt_length={rollout.prompt_length} + "
                f"{tree}.rollout.response_length={rollout.response_length} = {budget}): raise it or leave it unset"
            )
    if config.mlmt.placement != "colocated" or len(trees) < 2:
        return changed
    keys = [f"{tree}.rollout.gpu_memory_utilization" for tree in trees]
    for tree, key in zip(trees, keys, strict=True):
        if key not in user_keys:
            config[tree].rollout.gpu_memory_utilization = COLOCATED_SHARE
            changed.append(f"{key}={COLOCATED_SHARE}")
    shares = [config[tree].rollout.gpu_memory_utilization for tree in trees]
    if sum(shares) > COLOCATED_TOTAL + 1e-9:
        raise ConfigError(
            f"{keys[0]}={shares[0]} + {keys[1]}={shares[1]} = {sum(shares):g} of each device: under "
            f"mlmt.placement=colocated both levels' vLLM engines are awake at once beside both levels' actors; keep "
            f"the sum at or below {COLOCATED_TOTAL} (default {COLOCATED_SHARE} each), or use mlmt.placement=split"
        )
    return changed


def check_replica_sizes(config: DictConfig) -> None:
    """Each level's vLLM replica fits one node and its devices hold whole replicas (module docstring).

    Raises:
        ConfigError: Names ``<tree>.rollout.tensor_model_parallel_size`` and ``trainer.n_gpus_per_node`` (or
            ``mlmt.<level>_gpus``).
    """
    trainer = config.trainer
    for tree, level in list(zip(POLICY_TREES, ("ll", "hl"), strict=True))[: 2 if has_hl(config) else 1]:
        rollout = config[tree].rollout
        sizes = (rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.pipeline_model_parallel_size)
        replica = sizes[0] * sizes[1] * sizes[2]
        per_node = rollout.n_gpus_per_node
        if replica > per_node:
            nodes = -(-replica // per_node)
            raise ConfigError(
                f"{tree}.rollout.tensor_model_parallel_size={sizes[0]} (x data_parallel_size={sizes[1]} x "
                f"pipeline_model_parallel_size={sizes[2]} = {replica} devices per vLLM replica) is larger than "
                f"trainer.n_gpus_per_node={per_node}: verl would start each replica as a {nodes}-node "
                f"vLLM on one host. Set trainer.n_gpus_per_node to the devices of each node (at least {replica})"
            )
        if config.mlmt.placement == "split":
            key, devices = f"mlmt.{level}_gpus", config.mlmt[f"{level}_gpus"]
        else:
            key, devices = "trainer.n_gpus_per_node x trainer.nnodes", trainer.n_gpus_per_node * trainer.nnodes
        if devices % replica:
            raise ConfigError(
                f"{key}={devices} is not a multiple of the {replica} devices of one vLLM replica "
                f"({tree}.rollout.tensor_model_parallel_size={sizes[0]} x data_parallel_size x "
                f"pipeline_model_parallel_size): {devices % replica} device(s) would have no rollout server"
            )


def merge_ray_runtime_env(config: DictConfig, verl_runtime_env: dict) -> None:
    """Put verl's runtime ``env_vars`` under ``ray_kwargs.ray_init.runtime_env.env_vars`` (the config's win)."""
    with open_dict(config):
        ray_init = config.ray_kwargs.ray_init
        if ray_init.get("runtime_env") is None:
            ray_init.runtime_env = {}
        own = OmegaConf.to_container(ray_init.runtime_env.get("env_vars") or OmegaConf.create({}), resolve=True)
        ray_init.runtime_env.env_vars = {**verl_runtime_env.get("env_vars", {}), **own}


MIN_DRIVER = 580  # NVIDIA driver branch that runs CUDA 13 (the GPU sets' torch 2.11.0 and 2.13.0 wheels')


def nvidia_smi_versions(text: str) -> tuple[str | None, str | None]:
    """The driver and CUDA versions in ``nvidia-smi``'s header (``Driver Version: 535.104.05  CUDA Version: 12.2``)."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver.group(1) if driver else None), (cuda.group(1) if cuda else None)


def driver_message(
    torch_cuda_available: bool, smi_text: str | None, torch_version: str, torch_cuda: str | None
) -> str | None:
    """None when torch can use the GPU ``nvidia-smi`` shows (or no GPU is shown), else what is wrong and the fix.

    ``torch_cuda`` is ``torch.version.cuda`` (None for a CPU build of torch).
    """
    if torch_cuda_available or not smi_text:
        return None
    driver, cuda = nvidia_smi_versions(smi_text)
    seen = f"nvidia-smi shows a GPU (driver {driver or '?'}, highest CUDA {cuda or '?'})"
    if torch_cuda is None:
        return (
            f"{seen}, but torch {torch_version} is a CPU build: install the GPU set (README, GPU install: "
            "pip install -e '.[gpu]' -c requirements/constraints-gpu.txt), or set VERL_PLATFORM=cpu"
        )
    major = int(driver.split(".")[0]) if driver else None
    old = major is not None and major < MIN_DRIVER
    cause = (
        f"driver {driver} is older than R{MIN_DRIVER}, which CUDA {torch_cuda} needs"
        if old
        else "the driver and torch do not agree"
    )
    keep = (
        ", or keep this driver: CUDA forward compatibility (data-center GPUs) or the CUDA 12 set "
        '(docs/GPU_RUN.md, "Drivers older than R580")'
        if old
        else ""
    )
    return (
        f"{seen}, but torch.cuda.is_available() is False: torch {torch_version} is built for CUDA {torch_cuda}; "
        f"{cause}. Update the NVIDIA driver to R{MIN_DRIVER} or newer (README, GPU install){keep}, or set "
        "VERL_PLATFORM=cpu to run on the CPU backend"
    )


def check_driver() -> None:
    """:func:`driver_message` from this machine's ``nvidia-smi`` and torch.

    Raises:
        RuntimeError: torch cannot use the GPU that ``nvidia-smi`` shows.
    """
    import torch

    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        smi = None
    message = driver_message(torch.cuda.is_available(), smi, torch.__version__, torch.version.cuda)
    if message:
        raise RuntimeError(message)
    driver, cuda = nvidia_smi_versions(smi or "")
    logger.info(
        "GPU: driver %s (CUDA %s), torch %s built for CUDA %s", driver, cuda, torch.__version__, torch.version.cuda
    )


def check_compile_keys(config: DictConfig) -> None:
    """``<tree>.{actor,ref}.use_torch_compile`` must agree with the ``fsdp_config`` key the engine reads (the
    reference's only when set apart from the actor's, which it follows by default).

    Raises:
        ConfigError: Names the inert key and the one to set.
    """
    for tree in POLICY_TREES:
        for role in ("actor", "ref"):
            section = config[tree][role]
            inert, read = section.get("use_torch_compile"), section.fsdp_config.use_torch_compile
            if role == "ref" and inert == config.actor_rollout_ref.actor.get("use_torch_compile"):
                continue  # verl's default, an interpolation of the LL actor's key (whose check names this one)
            if inert is not None and bool(inert) != bool(read):
                raise ConfigError(
                    f"{tree}.{role}.use_torch_compile={str(inert).lower()} has no effect: verl 0.9.1's FSDP engine "
                    f"reads {tree}.{role}.fsdp_config.use_torch_compile (now {str(read).lower()}; it compiles the "
                    f"entropy computation). Set {tree}.{role}.fsdp_config.use_torch_compile instead"
                    + (f" (and {tree}.ref.fsdp_config.use_torch_compile for the reference)" if role == "actor" else "")
                )


def prepare_devices(config: DictConfig, user_overrides: list[str]) -> None:
    """Device settings and start-up checks of a run (module docstring), before any worker starts.

    Raises:
        ConfigError: A setting that cannot work on these devices; the message names the keys.
    """
    from agent_system import verl_plugin

    on_gpu = not verl_plugin.CPU_BACKEND_ACTIVE
    user_keys = override_keys(user_overrides)
    check_replica_sizes(config)
    check_compile_keys(config)
    from agent_system import verl_compat

    merge_ray_runtime_env(config, verl_compat.get_ppo_ray_runtime_env(config))
    logger.info("vLLM engines: %s", ", ".join(rollout_memory(config, user_keys)) or "as configured")
    device_memory_setting(config)  # mlmt.plan_device_gib, used by the run plan's memory estimate
    if on_gpu:
        check_driver()
        flash_attn, reason = flash_attn_importable()
        changed = attention_fallback(config, on_gpu, flash_attn)
        if changed:
            logger.warning(
                "flash_attn does not import (%s): actor, reference and critic models of both levels load with sdpa "
                "and unpacked sequences (%s), the path CI runs; install flash-attn for verl's default",
                reason,
                ", ".join(changed),
            )
