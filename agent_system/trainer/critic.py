"""A level's value model for PPO (``mlmt.<level>.adv_estimator=gae``), on verl's ``TrainingWorker``.

Built the way verl's own trainer builds its critic (``CriticConfig`` → ``TrainingWorkerConfig`` with
``model_type="value_model"``, loss ``verl.workers.utils.losses.value_loss``), in its own resource pool.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from verl import DataProto

from agent_system import verl_compat as vc
from agent_system.trainer.policy import flatten_metrics, largest_divisor_at_most, to_padding_free


class CriticGroup:
    """Worker group of one level's critic; ``compute_values`` and ``update`` over ``DataProto`` rows."""

    def __init__(self, level: str, view: DictConfig) -> None:
        self.level = level
        self.temperature = view.actor_rollout_ref.rollout.temperature
        self.critic_config = vc.omega_conf_to_dataclass(view.critic)
        engine = self.critic_config.engine
        engine.infer_max_token_len_per_gpu = self.critic_config.ppo_infer_max_token_len_per_gpu
        engine.max_token_len_per_gpu = self.critic_config.ppo_max_token_len_per_gpu
        worker_config = vc.TrainingWorkerConfig(
            model_type="value_model",
            model_config=self.critic_config.model,
            engine_config=engine,
            optimizer_config=self.critic_config.optim,
            checkpoint_config=self.critic_config.checkpoint,
        )
        pool = vc.RayResourcePool(
            process_on_nodes=[1], use_gpu=True, max_colocate_count=1, name_prefix=f"mlmt_{level}_critic"
        )
        self.worker_group = vc.RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=vc.RayClassWithInitArgs(cls=ray.remote(vc.TrainingWorker), config=worker_config),
            name_prefix=f"mlmt_{level}_critic",
            device_name=vc.get_device_name(),
        )

    def init(self) -> None:
        self.worker_group.reset()
        self.worker_group.set_loss_fn(partial(vc.value_loss, config=self.critic_config))

    def _tensordict(self, batch: DataProto, **meta: Any):
        return to_padding_free(batch, temperature=self.temperature, **meta)

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Value estimates of every response position, (B, R)."""
        td = self._tensordict(batch, compute_loss=False)
        output = self.worker_group.infer_batch(td).get()
        return vc.no_padding_2_padding(vc.tensordict_utils.get(output, "values"), td).float()

    def update(self, batch: DataProto) -> dict[str, float]:
        """One critic update on ``values`` / ``returns`` of ``batch``."""
        size = largest_divisor_at_most(len(batch), self.critic_config.ppo_mini_batch_size)
        td = self._tensordict(
            batch,
            global_batch_size=size,
            mini_batch_size=size,
            epochs=self.critic_config.ppo_epochs,
            seed=self.critic_config.data_loader_seed,
            dataloader_kwargs={"shuffle": self.critic_config.shuffle},
        )
        output = self.worker_group.train_mini_batch(td).get()
        return {
            f"critic/{k.removeprefix('critic/')}": v
            for k, v in flatten_metrics(vc.tensordict_utils.get(output, "metrics")).items()
        }

    def save_checkpoint(self, path: str, global_steps: int) -> None:
        self.worker_group.save_checkpoint(path, None, global_steps, None)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path, None, False)
