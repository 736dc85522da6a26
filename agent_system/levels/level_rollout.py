"""verl's vLLM rollout for two models in one Ray job: each level's replicas get their own replica ranks.

verl 0.9.1 assumes one hybrid (actor + rollout) model per job. The replica rank names the server actor
(``vllm_server_{rank}_{node}``), which the in-worker adapter looks up, and it names the ZMQ socket of the weight
transfer (``/tmp/rl-colocate-zmq-{job}-replica-{rank}-rank-{i}.sock``) on both ends. Two levels that both count
replicas from 0 therefore collide: the second level's servers cannot be created, and weight syncs of the two levels
would share a socket path.

The two classes here are verl's own vLLM replica and in-worker adapter with one change: their replica rank is
offset by ``rollout.custom.replica_rank_offset`` (the number of replicas of the levels before this one, set by
:func:`agent_system.levels.placement.assign_replica_ranks`). The replica still takes its workers from its level's
worker group by its local index. Registered for ``rollout.name=vllm`` by :mod:`agent_system.verl_plugin`, in every
process (the driver creates replicas, the workers create adapters); with an offset of 0 they behave exactly as
verl's classes.
"""

from __future__ import annotations

import os
from typing import Any

from agent_system import verl_compat as vc


def replica_rank_offset(config: Any) -> int:
    custom = getattr(config, "custom", None) or {}
    return int(custom.get("replica_rank_offset", 0) or 0)


def _rollout_world_size(config: Any) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


class LevelvLLMReplica(vc.vLLMReplica):
    """verl's ``vLLMReplica`` whose rank is offset by ``rollout.custom.replica_rank_offset``."""

    def __init__(self, replica_rank: int, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(replica_rank + replica_rank_offset(config), config, *args, **kwargs)
        self.local_index = replica_rank  # position among this level's replicas

    async def init_hybrid(self, worker_group: Any) -> None:
        """As verl's, but the workers are chosen by the level-local index, not the job-wide rank."""
        self.rollout_mode = vc.RolloutMode.HYBRID
        self.workers = worker_group.workers[
            self.world_size * self.local_index : self.world_size * (self.local_index + 1)
        ]
        await self.launch_servers()


class LevelServerAdapter(vc.vLLMServerAdapter):
    """verl's in-worker vLLM adapter whose replica rank (server name, ZMQ socket) has the same offset."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        if replica_rank == -1:
            replica_rank = int(os.environ["RANK"]) // _rollout_world_size(config) + replica_rank_offset(config)
        super().__init__(config, model_config, device_mesh, replica_rank=replica_rank)
