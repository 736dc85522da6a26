"""The lagged LL snapshot: the reference solver of the contrastive HL reward (MLMT_SPEC §2.4).

The original's ``reg`` regulariser: a second copy of the solver, refreshed from the LL's weights every ``reg_gap``
steps, regenerates turn 3 from the **same** prompt (x, z, g) as the current LL. Its score R_ref therefore varies with
the feedback g, and the HL score S2 = (1 + λ)·R3 − λ·R_ref rewards feedback that helps the *current* solver more than
a stale one (a per-feedback R_ref, unlike the no-feedback refinement, does not cancel inside an HL group).

The snapshot is its own :class:`~agent_system.trainer.policy.PolicyGroup` (verl's ``ActorRolloutRefWorker`` with
role ``actor_rollout``, on its own resource pool of ``mlmt.ll_gpus`` processes, its replicas ranked after the HL's)
that only generates: it is never updated. The original shared the LL's GPUs (``max_colocate_count=2``); here it
needs ``mlmt.ll_gpus`` devices of its own. A refresh saves the LL's checkpoint to
``<trainer.default_local_dir>/reg_ref_checkpoint`` (as the original does), loads it into the snapshot's actor and
pushes it into the snapshot's rollout servers. It starts from the LL's initial weights; on resume it reloads that
folder when present (the snapshot of the last refresh).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from agent_system import verl_compat as vc
from agent_system.cpu_backend.hf_server import stop_tokens
from agent_system.multi_turn_rollout.episode import Episode, Turn, turn_from_output
from agent_system.prompts.templates import Prompt
from agent_system.trainer.placement import level_nodes
from agent_system.trainer.policy import PolicyGroup

logger = logging.getLogger(__name__)

SNAPSHOT = "ll_snapshot"


def snapshot_view(config: DictConfig) -> DictConfig:
    """The LL's view of the config with the snapshot's own rollout-server tag and replica ranks.

    verl names rollout servers and weight-transfer sockets by replica rank; the LL's and HL's replicas take the
    first ranks (``placement.assign_replica_ranks``), the snapshot's come after the HL's.
    """
    hl_rollout = config.hl.rollout
    hl_ranks = (
        config.mlmt.hl_gpus
        if config.mlmt.placement == "split"
        else config.trainer.n_gpus_per_node * config.trainer.nnodes
    )
    per_replica = (
        hl_rollout.tensor_model_parallel_size * hl_rollout.data_parallel_size * hl_rollout.pipeline_model_parallel_size
    )
    hl_offset = int((hl_rollout.get("custom") or {}).get("replica_rank_offset", 0) or 0)
    view = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(view):
        view.actor_rollout_ref.rollout.custom = {**(view.actor_rollout_ref.rollout.get("custom") or {})}
        view.actor_rollout_ref.rollout.custom.server_tag = SNAPSHOT
        view.actor_rollout_ref.rollout.custom.replica_rank_offset = hl_offset + max(hl_ranks // per_replica, 1)
    return view


class LaggedSnapshot:
    """A generate-only copy of the LL, refreshed from the LL every ``mlmt.reward.reg_gap`` steps."""

    def __init__(self, config: DictConfig) -> None:
        view = snapshot_view(config)
        pool = vc.RayResourcePool(
            process_on_nodes=level_nodes(config, "ll"),  # shaped like the LL's pool (one node, or whole nodes)
            use_gpu=True,
            max_colocate_count=1,
            name_prefix=f"mlmt_{SNAPSHOT}",
        )
        worker_group = vc.RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=PolicyGroup.worker_class(view, use_ref=False),
            name_prefix=f"mlmt_{SNAPSHOT}",
            device_name=vc.get_device_name(),
        )
        self.group = PolicyGroup(SNAPSHOT, view, worker_group, use_ref=False)
        self.reg_gap = int(config.mlmt.reward.reg_gap)
        self.folder = Path(config.trainer.default_local_dir) / "reg_ref_checkpoint"
        self.refreshed_at = 0

    def init(self) -> None:
        """Start the snapshot's actor (the LL's initial weights) and its rollout servers."""
        self.group.init()

    def due(self, step: int) -> bool:
        """A refresh is due after the LL's update at every ``reg_gap``-th step."""
        return step % self.reg_gap == 0

    def refresh(self, ll: PolicyGroup, step: int) -> None:
        """Copy the LL's current weights into the snapshot (through the LL's checkpoint, as the original)."""
        ll.save_checkpoint(str(self.folder), step)
        self.load(step)

    def load(self, step: int) -> None:
        """Load ``reg_ref_checkpoint`` into the snapshot's actor and rollout servers."""
        self.group.load_checkpoint(str(self.folder))
        self.group.sync_weights(step)
        self.refreshed_at = step
        logger.info("LL snapshot refreshed at step %d from %s", step, self.folder)

    def restore(self, step: int) -> None:
        """On resume: the snapshot of the last refresh, if one was written."""
        if self.folder.is_dir() and any(self.folder.iterdir()):
            self.load(step)

    def refine(
        self, episodes: list[Episode], tokenizer, max_tokens: int, temperature: float, step: int
    ) -> list[list[list[Turn]]]:
        """One snapshot refinement per LL refinement, from the same turn-3 prompt ids: ``[problem][attempt][k]``."""

        stop_ids = set(stop_tokens(tokenizer.name_or_path, tokenizer)[0])

        async def one(prompt: Prompt, request_id: str) -> Turn:
            output = await self.group.generate(prompt.ids, max_tokens, temperature, request_id)
            return turn_from_output(prompt, output, tokenizer, max_tokens, stop_ids)

        async def run() -> list[Turn]:
            jobs = [
                one(r.refinement.prompt, f"snap/s{step}/p{e.problem_index}/a{j}/f{k}")
                for e in episodes
                for j, attempt in enumerate(e.attempts)
                for k, r in enumerate(attempt.refinements)
            ]
            return list(await asyncio.gather(*jobs))

        self.group.wake_up(step)
        try:
            flat = iter(asyncio.run(run()))
        finally:
            self.group.sleep()
        return [[[next(flat) for _ in attempt.refinements] for attempt in e.attempts] for e in episodes]
