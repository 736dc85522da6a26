"""Where the workers run: the LL and HL policy workers and their critics, on verl resource pools.

``mlmt.placement=split``: one resource pool per level (``mlmt.ll_gpus`` / ``mlmt.hl_gpus`` processes each, on one
node, or spread over ``mlmt.<level>_gpus / trainer.n_gpus_per_node`` whole nodes when the job has several nodes and the
level has more devices than one node: ``config.level_nodes``); a level's critic (``adv_estimator=gae``) is fused into
the same processes as the level's actor, as verl colocates its own actor and critic, so it never asks for devices of
its own. ``colocated``: one pool of ``trainer.n_gpus_per_node × trainer.nnodes`` processes, each hosting both
levels' workers (and critics). Fusing uses verl's ``create_colocated_worker_cls``.

The launcher checks every pool of the run against Ray's free resources before any is made
(``launcher/gpu_checks.py``: verl waits for a placement group without a time-out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, open_dict

from agent_system import verl_compat as vc
from agent_system.config import has_hl, level_nodes, level_view
from agent_system.levels.critic import CriticGroup
from agent_system.levels.policy import PolicyGroup

LEVELS = ("ll", "hl")


def build_workers(
    config: DictConfig,
    use_ref: dict[str, bool],
    critic_losses: dict[str, Callable | None] | None = None,
    actor_classes: dict[str, type] | None = None,
) -> tuple[dict[str, PolicyGroup], dict[str, CriticGroup]]:
    """Create the policy groups and critics of both levels, or of the LL alone without an HL (not yet initialised).

    ``critic_losses``: the levels that get a critic (``advantages.critic_levels``), each with a method's loss or None
    (verl's value loss). ``actor_classes``: a level's worker class when a method extends the default
    (``Extension.actor_class``)."""
    assign_replica_ranks(config)
    levels = LEVELS if has_hl(config) else ("ll",)  # mlmt.feedback=self|none: the solver alone
    views = {level: level_view(config, level) for level in levels}
    actor_classes = actor_classes or {}
    classes = {
        f"{level}_actor": PolicyGroup.worker_class(views[level], use_ref[level], actor_classes.get(level))
        for level in levels
    }
    classes.update({f"{level}_critic": CriticGroup.worker_class(views[level]) for level in critic_losses or {}})
    if config.mlmt.placement == "split":
        spawned = {}
        for level in levels:
            pool = vc.RayResourcePool(
                process_on_nodes=level_nodes(config, level),
                use_gpu=True,
                max_colocate_count=1,
                name_prefix=f"mlmt_{level}",
            )
            spawned.update(_worker_groups(pool, {k: v for k, v in classes.items() if k.startswith(level)}, level))
    else:
        pool = vc.RayResourcePool(
            process_on_nodes=[config.trainer.n_gpus_per_node] * config.trainer.nnodes,
            use_gpu=True,
            max_colocate_count=1,
            name_prefix="mlmt_shared",
        )
        spawned = _worker_groups(pool, classes, "shared")
    groups = {level: PolicyGroup(level, views[level], spawned[f"{level}_actor"], use_ref[level]) for level in levels}
    critics = {
        level: CriticGroup(level, views[level], spawned[f"{level}_critic"], loss)
        for level, loss in (critic_losses or {}).items()
    }
    return groups, critics


def _worker_groups(pool: Any, classes: dict[str, Any], name: str) -> dict[str, Any]:
    """One worker group per class on ``pool``: a plain group for one class, fused processes for several."""
    device = vc.get_device_name()
    if len(classes) == 1:
        ((key, cls),) = classes.items()
        return {
            key: vc.RayWorkerGroup(
                resource_pool=pool, ray_cls_with_init=cls, name_prefix=f"mlmt_{name}", device_name=device
            )
        }
    fused = vc.RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=vc.create_colocated_worker_cls(class_dict=classes),
        name_prefix=f"mlmt_{name}",
        device_name=device,
    )
    return fused.spawn(prefix_set=classes.keys())


def assign_replica_ranks(config: DictConfig) -> None:
    """Give the HL's rollout replicas ranks after the LL's (``rollout.custom.replica_rank_offset``).

    verl names server actors and weight-transfer sockets by replica rank; see ``level_rollout``.
    """
    rollout = config.actor_rollout_ref.rollout
    ranks = (
        config.mlmt.ll_gpus
        if config.mlmt.placement == "split"
        else config.trainer.n_gpus_per_node * config.trainer.nnodes
    )
    per_replica = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    with open_dict(config):
        config.actor_rollout_ref.rollout.custom.replica_rank_offset = 0
        config.hl.rollout.custom.replica_rank_offset = max(ranks // per_replica, 1)
