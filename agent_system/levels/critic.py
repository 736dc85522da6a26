"""A level's value model for PPO (``mlmt.<level>.adv_estimator=gae``), on verl's ``TrainingWorker``.

Built the way verl's own trainer builds its critic (``CriticConfig`` → ``TrainingWorkerConfig`` with
``model_type="value_model"``, loss ``verl.workers.utils.losses.value_loss``) and placed with its level: its workers
are fused into the level's worker processes (see ``placement.build_workers``), so a critic never needs devices
of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from verl import DataProto

from agent_system import verl_compat as vc
from agent_system.levels.balance import Balance
from agent_system.levels.policy import flatten_metrics, for_ranks, mini_batch_size, padded_rows, to_padding_free


class CriticGroup:
    """Worker group of one level's critic; ``compute_values`` and ``update`` over ``DataProto`` rows."""

    def __init__(self, level: str, view: DictConfig, worker_group: Any, loss: Callable | None = None) -> None:
        """``loss``: a method's critic loss (``Extension.critic_loss``), else verl's ``value_loss``."""
        self.level = level
        self.temperature = view.actor_rollout_ref.rollout.temperature
        self.critic_config = critic_config(view)
        self.worker_group = worker_group
        self.loss_fn = partial(loss or vc.value_loss, config=self.critic_config)

    @staticmethod
    def worker_class(view: DictConfig) -> Any:
        """``RayClassWithInitArgs`` of verl's ``TrainingWorker`` holding this level's value model."""
        config = critic_config(view)
        worker_config = vc.TrainingWorkerConfig(
            model_type="value_model",
            model_config=config.model,
            engine_config=config.engine,
            optimizer_config=config.optim,
            checkpoint_config=config.checkpoint,
        )
        return vc.RayClassWithInitArgs(cls=ray.remote(vc.TrainingWorker), config=worker_config)

    def init(self) -> None:
        self.worker_group.reset()
        self.worker_group.set_loss_fn(self.loss_fn)

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Value estimates of every response position, (B, R), in ``batch``'s row order."""
        ranked, rows, _ = for_ranks(batch, self.worker_group.world_size)
        td = to_padding_free(ranked, temperature=self.temperature, compute_loss=False)
        output = self.worker_group.infer_batch(td).get()
        return vc.no_padding_2_padding(vc.tensordict_utils.get(output, "values"), td).float()[rows]

    def update(self, batch: DataProto) -> dict[str, float]:
        """One critic update on ``values`` / ``returns`` of ``batch`` (padded with masked rows to the DP size and,
        with more than one rank, balanced over the ranks as the actor's: ``critic/rank_tokens_max|min``)."""
        td, balance = update_data(batch, self.critic_config, self.worker_group.world_size, self.temperature)
        output = self.worker_group.train_mini_batch(td).get()
        metrics = flatten_metrics(vc.tensordict_utils.get(output, "metrics")) | (balance.metrics() if balance else {})
        return {f"critic/{k.removeprefix('critic/')}": v for k, v in metrics.items()}

    def save_checkpoint(self, path: str, global_steps: int) -> None:
        self.worker_group.save_checkpoint(path, None, global_steps, None)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path, None, False)


def update_data(batch: DataProto, config: Any, world_size: int, temperature: float) -> tuple[Any, Balance | None]:
    """The padding-free ``TensorDict`` that ``train_mini_batch`` takes for one critic update of ``batch``, and its
    :class:`~agent_system.levels.balance.Balance` over the ranks (None on one rank).

    ``batch`` is padded with masked rows to a multiple of ``world_size``, put in the balanced row order of
    :func:`policy.for_ranks` (as the actor's batches: each mini-batch mixing turns and lengths, shuffled with
    ``config.data_loader_seed``) and split by verl into mini-batches of :func:`policy.mini_batch_size` rows (one
    optimizer step each, ``config.ppo_epochs`` passes).
    """
    size = mini_batch_size(padded_rows(len(batch), world_size), config.ppo_mini_batch_size, world_size)
    batch, _, balance = for_ranks(batch, world_size, size, config.data_loader_seed)
    td = to_padding_free(
        batch,
        temperature=temperature,
        global_batch_size=size,
        mini_batch_size=size,
        epochs=config.ppo_epochs,
        seed=config.data_loader_seed,
        dataloader_kwargs={"shuffle": config.shuffle},
    )
    return td, balance


def critic_config(view: DictConfig) -> Any:
    """verl's ``CriticConfig`` of the level in ``view`` with the engine's token budgets set from it."""
    config = vc.omega_conf_to_dataclass(view.critic)
    config.engine.infer_max_token_len_per_gpu = config.ppo_infer_max_token_len_per_gpu
    config.engine.max_token_len_per_gpu = config.ppo_max_token_len_per_gpu
    return config
