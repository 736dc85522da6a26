"""One policy level (the solver LL or the feedback writer HL) assembled from verl's own pieces.

A :class:`PolicyGroup` owns, for its level:

* a ``RayWorkerGroup`` of verl's ``ActorRolloutRefWorker`` (FSDP2 engine, optimizer, reference model when a KL
  coefficient needs it), optionally fused with the other level's workers (``colocated`` placement);
* its rollout servers (``LLMServerManager``: vLLM on GPU, the project's ``hf`` server on CPU) and a client;
* its weight sync (``CheckpointEngineManager``), run only after the level was updated.

All tensors cross this boundary as ``DataProto`` with left-padded prompts and right-padded responses
(``input_ids`` (B, P+R), ``attention_mask`` (B, P+R), ``position_ids`` (B, P+R), ``responses`` (B, R),
``response_mask`` (B, R)), converted to verl's padding-free ``TensorDict`` here, as verl's ``RayPPOTrainer`` does.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from verl import DataProto

from agent_system import verl_compat as vc

logger = logging.getLogger(__name__)


class PolicyGroup:
    """Workers, rollout servers and weight sync of one level; see the module docstring."""

    def __init__(self, level: str, view: DictConfig, worker_group: Any, use_ref: bool) -> None:
        self.level = level
        self.view = view  # whole config with this level at actor_rollout_ref
        self.config = view.actor_rollout_ref
        self.worker_group = worker_group
        self.use_ref = use_ref
        self.server_manager = None
        self.client = None
        self.checkpoint_manager = None

    # ---------------------------------------------------------------- construction
    @staticmethod
    def worker_class(view: DictConfig, use_ref: bool) -> Any:
        """``RayClassWithInitArgs`` of verl's ActorRolloutRefWorker for this level."""
        role = "actor_rollout_ref" if use_ref else "actor_rollout"
        return vc.RayClassWithInitArgs(
            cls=ray.remote(vc.ActorRolloutRefWorker), config=view.actor_rollout_ref, role=role
        )

    def init(self) -> None:
        """Initialise the models (actor, ref), start the rollout servers and the weight-sync manager."""
        self.worker_group.init_model()
        self.server_manager = vc.LLMServerManager.create(config=self.view, worker_group=self.worker_group)
        self.client = self.server_manager.get_client()
        engine_config = vc.omega_conf_to_dataclass(self.config.rollout.checkpoint_engine)
        self.checkpoint_manager = vc.CheckpointEngineManager(
            config=engine_config, actor_wg=self.worker_group, replicas=self.server_manager.get_replicas()
        )

    # ---------------------------------------------------------------- generation
    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, request_id: str) -> Any:
        """One response from this level's rollout server: verl ``TokenOutput`` (token ids and log-probs)."""
        sampling = {
            "temperature": temperature,
            "top_p": self.config.rollout.top_p,
            "top_k": self.config.rollout.top_k,
            "max_tokens": max_tokens,
            "logprobs": True,
        }
        return await self.client.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling)

    # ---------------------------------------------------------------- training-side computations
    def _to_tensordict(self, batch: DataProto, **meta: Any):
        # log-probs are of softmax(logits / T), the distribution the rollout sampled from
        return to_padding_free(batch, temperature=self.config.rollout.temperature, **meta)

    def compute_log_prob(self, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor log-probs and entropies of the responses, each (B, R)."""
        td = self._to_tensordict(batch, calculate_entropy=True, compute_loss=False)
        output = self.worker_group.compute_log_prob(td)
        log_probs = vc.no_padding_2_padding(vc.tensordict_utils.get(output, "log_probs"), td)
        entropy = vc.no_padding_2_padding(vc.tensordict_utils.get(output, "entropy"), td)
        return log_probs.float(), entropy.float()

    def compute_ref_log_prob(self, batch: DataProto) -> torch.Tensor:
        """Reference-model log-probs of the responses, (B, R)."""
        td = self._to_tensordict(batch, calculate_entropy=False, compute_loss=False)
        output = self.worker_group.compute_ref_log_prob(td)
        return vc.no_padding_2_padding(vc.tensordict_utils.get(output, "log_probs"), td).float()

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """One PPO/GRPO update over ``batch`` (needs ``old_log_probs`` and ``advantages``); returns metrics."""
        actor = self.config.actor
        batch.meta_info["multi_turn"] = False
        mini_batch = largest_divisor_at_most(len(batch), actor.ppo_mini_batch_size)
        td = self._to_tensordict(
            batch,
            calculate_entropy=actor.calculate_entropy or actor.entropy_coeff != 0.0,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini_batch,
            mini_batch_size=mini_batch,
            epochs=actor.ppo_epochs,
            seed=actor.data_loader_seed,
            dataloader_kwargs={"shuffle": actor.shuffle},
            compute_loss=True,
        )
        output = self.worker_group.update_actor(td)
        return flatten_metrics(vc.tensordict_utils.get(output, "metrics"))

    def sync_weights(self, global_steps: int) -> None:
        """Push the actor's weights into this level's rollout servers."""
        self.checkpoint_manager.update_weights(global_steps=global_steps)

    def save_checkpoint(self, path: str, global_steps: int) -> None:
        self.worker_group.save_checkpoint(path, None, global_steps, None)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path, None, False)


def to_padding_free(batch: DataProto, **meta: Any) -> Any:
    """verl's padding-free ``TensorDict`` of ``batch`` with ``meta`` attached, as verl's workers take it."""
    td = vc.left_right_2_no_padding(batch.to_tensordict())
    vc.tensordict_utils.assign_non_tensor(td, **meta)
    return td


def largest_divisor_at_most(total: int, limit: int) -> int:
    """verl's actor splits a batch into equal mini-batches; pick the largest size <= limit that divides it."""
    return next(size for size in range(min(total, max(limit, 1)), 0, -1) if total % size == 0)


def flatten_metrics(metrics: Any) -> dict[str, float]:
    """verl returns per-micro-batch metric lists; report their mean."""
    flat = {}
    for key, value in dict(metrics).items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) or torch.is_tensor(v)]
        if numbers:
            flat[key] = sum(numbers) / len(numbers)
    return flat


def build_policy_groups(config: DictConfig, use_ref: dict[str, bool]) -> dict[str, PolicyGroup]:
    """Create the LL and HL worker groups with the configured placement (models not yet initialised).

    ``split``: one resource pool per level (``mlmt.ll_gpus`` / ``mlmt.hl_gpus`` processes each).
    ``colocated``: one pool of ``trainer.n_gpus_per_node * trainer.nnodes`` processes, each hosting both levels'
    workers (verl's ``create_colocated_worker_cls``).
    """
    from agent_system.trainer.config import level_view

    views = {level: level_view(config, level) for level in ("ll", "hl")}
    classes = {level: PolicyGroup.worker_class(views[level], use_ref[level]) for level in views}
    device = vc.get_device_name()
    if config.mlmt.placement == "split":
        groups = {}
        for level in ("ll", "hl"):
            size = config.mlmt[f"{level}_gpus"]
            pool = vc.RayResourcePool(
                process_on_nodes=[size], use_gpu=True, max_colocate_count=1, name_prefix=f"mlmt_{level}"
            )
            worker_group = vc.RayWorkerGroup(
                resource_pool=pool, ray_cls_with_init=classes[level], name_prefix=f"mlmt_{level}", device_name=device
            )
            groups[level] = PolicyGroup(level, views[level], worker_group, use_ref[level])
        return groups
    size = config.trainer.n_gpus_per_node
    pool = vc.RayResourcePool(
        process_on_nodes=[size] * config.trainer.nnodes, use_gpu=True, max_colocate_count=1, name_prefix="mlmt_shared"
    )
    fused_cls = vc.create_colocated_worker_cls(class_dict=classes)
    fused = vc.RayWorkerGroup(
        resource_pool=pool, ray_cls_with_init=fused_cls, name_prefix="mlmt_shared", device_name=device
    )
    spawned = fused.spawn(prefix_set=classes.keys())
    return {level: PolicyGroup(level, views[level], spawned[level], use_ref[level]) for level in ("ll", "hl")}
