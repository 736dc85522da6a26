"""One policy level (the solver LL or the feedback writer HL) assembled from verl's own pieces.

A :class:`PolicyGroup` owns, for its level:

* a ``RayWorkerGroup`` of verl's ``ActorRolloutRefWorker`` (FSDP2 engine, optimizer, reference model when a KL
  coefficient needs it), optionally fused with the other level's workers (``colocated`` placement);
* its rollout servers (``LLMServerManager``: vLLM on GPU, the project's ``hf`` server on CPU) and a client;
* its weight sync (``CheckpointEngineManager``): :meth:`PolicyGroup.wake_up` pushes the actor's weights into the
  servers only when they do not hold them (after an update or a checkpoint load, :meth:`PolicyGroup.weights_changed`,
  or after a sleep that freed them), counted and timed per level, and wakes servers that slept keeping their weights
  without a push; when the servers sleep, and whether they keep their weights, is decided in
  :mod:`agent_system.levels.weight_sync`.

With more than one data-parallel rank, every batch sent to the workers is put in a balanced row order first
(:mod:`agent_system.levels.balance`): similar token counts per rank, each optimizer step's rows mixing turns and
lengths (a seeded stratified shuffle), and the same order for any permutation of the same rows; outputs come back in
the caller's row order.

All tensors cross this boundary as ``DataProto`` with left-padded prompts and right-padded responses
(``input_ids`` (B, P+R), ``attention_mask`` (B, P+R), ``position_ids`` (B, P+R), ``responses`` (B, R),
``response_mask`` (B, R)), converted to verl's padding-free ``TensorDict`` here, as verl's ``RayPPOTrainer`` does.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from verl import DataProto

from agent_system import verl_compat as vc
from agent_system.config import POLICY_TREES, lora_rank
from agent_system.levels.balance import Balance, balanced_order, canonical_order

logger = logging.getLogger(__name__)


def request_seed(level_seed: int, request_id: str) -> int:
    """The sampling seed of one request: a hash of the level's ``rollout.seed`` and the request's id (63 bits)."""
    digest = hashlib.blake2b(f"{level_seed}/{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def rollout_memory_keys(level: str, rollout_name: str, on_cpu: bool | None = None) -> str:
    """The keys that size a level's rollout server's memory, as its error messages name them.

    ``on_cpu``: whether the project's CPU backend runs verl (default: as in this process)."""
    from agent_system import verl_plugin

    on_cpu = verl_plugin.CPU_BACKEND_ACTIVE if on_cpu is None else on_cpu
    rollout = f"{POLICY_TREES[level]}.rollout"
    if rollout_name == "hf":
        return f"{rollout}.engine_kwargs.hf.max_batch_size"
    if on_cpu:  # vLLM-CPU's KV cache is sized in bytes (the CPU overlay sets it), not as a share of a device
        return f"{rollout}.engine_kwargs.vllm.kv_cache_memory_bytes"
    return f"{rollout}.gpu_memory_utilization, {rollout}.max_num_seqs"


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
        self.rollout_current = False  # do the servers hold the actor's current weights (awake or asleep)?
        self.awake = True  # False after a sleep in sleep mode, until the next wake-up
        self.weight_syncs = 0  # weight pushes actor -> rollout servers since start (RolloutWeights.take reads them)
        self.sync_seconds = 0.0  # the time those pushes took

    # ---------------------------------------------------------------- construction
    @staticmethod
    def worker_class(view: DictConfig, use_ref: bool, actor_class: type | None = None) -> Any:
        """``RayClassWithInitArgs`` of this level's worker: ``actor_class`` (a method's subclass, from
        ``Extension.actor_class``) or the project's ``turn_kl.ActorWorker`` (verl's worker + per-turn KL loss).

        A LoRA level builds no reference model: its reference is the actor with the adapter off
        (:attr:`ref_in_actor`)."""
        from agent_system.levels.turn_kl import ActorWorker

        role = "actor_rollout_ref" if use_ref and not reference_is_base(view) else "actor_rollout"
        cls = actor_class or ActorWorker
        return vc.RayClassWithInitArgs(cls=ray.remote(cls), config=view.actor_rollout_ref, role=role)

    @property
    def ref_in_actor(self) -> bool:
        """Whether the reference log-probs come from the actor with its LoRA adapter switched off (the base model,
        verl's ``no_lora_adapter``) rather than from a second copy of the model."""
        return self.use_ref and reference_is_base(self.view)

    @property
    def turn_kl_loss(self) -> bool:
        """Whether the actor's loss adds each row's β·KL (``mlmt.stages.kl_in=loss`` with a reference model)."""
        return self.use_ref and self.view.mlmt.stages.kl_in == "loss"

    @property
    def world_size(self) -> int:
        """Data-parallel size of the actor: every batch sent to the workers is a multiple of it."""
        return self.worker_group.world_size

    def init(self) -> None:
        """Initialise the models (actor, ref), start the rollout servers and the weight-sync manager.

        The level's replica ranks start after the other level's (``placement.assign_replica_ranks``). The servers
        are put to sleep as verl's own trainer does; :meth:`wake_up` loads the actor's weights into them before the
        first generation (vLLM starts from ``load_format=dummy`` weights).
        """
        self.worker_group.init_model()
        if self.turn_kl_loss:
            self.worker_group.use_turn_kl_loss(self.config.actor.kl_loss_type)
        self.server_manager = vc.LLMServerManager.create(config=self.view, worker_group=self.worker_group)
        self.client = self.server_manager.get_client()
        # Wait for the request router here, in the level's start-up (which runs beside the other level's under split
        # placement), rather than inside the first generation: its process imports verl (5-8 s on 2 CPU cores).
        ray.get(vc.rollout_router(self.server_manager).__ray_ready__.remote())
        engine_config = vc.omega_conf_to_dataclass(self.config.rollout.checkpoint_engine)
        self.checkpoint_manager = vc.CheckpointEngineManager(
            config=engine_config, actor_wg=self.worker_group, replicas=self.server_manager.get_replicas()
        )
        self.checkpoint_manager.sleep_replicas()
        self.awake = not self.sleeps

    @property
    def sleeps(self) -> bool:
        """True when sleeping frees the rollout's weights (``rollout.free_cache_engine``, vLLM sleep mode on GPU)."""
        return bool(self.config.rollout.free_cache_engine)

    # ---------------------------------------------------------------- rollout memory and weights (verl's pattern)
    def check_servers_alive(self, timeout_s: float = 60.0) -> None:
        """Raise, naming them, when rollout servers of this level died (Ray's OOM killer, a crash).

        A weight sync sent to a dead server waits forever instead of failing (measured: a run whose HL vLLM server
        Ray's OOM killer stopped hung in the HL's sync), so every wake-up asks each server first, and
        :meth:`push_weights` asks again while the sync runs. A server that is alive but does not answer within
        ``timeout_s`` is only logged."""
        dead, silent = self._server_states(timeout_s)
        if dead:
            raise self._servers_died(dead)
        if silent:
            logger.warning(
                "%s rollout server(s) of replica(s) %s did not answer within %.0f s",
                self.level.upper(),
                silent,
                timeout_s,
            )

    def _server_states(self, timeout_s: float) -> tuple[list[str], list[int]]:
        """The dead servers (``replica R: Ray's reason``) and the replicas whose servers did not answer in time."""
        servers = [
            (rank, server)
            for rank, replica in enumerate(self.checkpoint_manager.replicas)
            for server in replica.servers
        ]
        if not servers:
            return [], []
        pings = {server.__ray_ready__.remote(): rank for rank, server in servers}
        ready, pending = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
        dead = []
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as error:
                dead.append(f"replica {pings[ref]}: {str(error).strip().splitlines()[0]}")
        return dead, sorted({pings[ref] for ref in pending})

    def _servers_died(self, dead: list[str]) -> RuntimeError:
        return RuntimeError(
            f"{self.level.upper()} rollout server(s) died, the run cannot go on: {'; '.join(dead)}. Ray's "
            "memory monitor stops the largest process when the node runs out of memory: see the workers' logs "
            f"(logs/ in the run folder) and lower {rollout_memory_keys(self.level, self.config.rollout.name)} "
            "or data.train_batch_size; resume from the last checkpoint with trainer.resume_mode=auto."
        )

    def push_weights(self, global_steps: int, watch_s: float = 10.0) -> None:
        """Load the actor's weights into the servers (verl's weight sync), raising when a server dies meanwhile.

        verl's sync waits for ever on a server that is dead: one that dies during the sync, or one that died just
        before it but still answered the wake-up's check (Ray reports an actor dead a moment after it stops:
        measured, 2 of 20 pings sent right after ``ray.kill`` were answered). So the sync runs in a thread while
        this one asks the servers every ``watch_s`` seconds and raises, naming them, when one died; a sync that
        failed on a dead server raises the same error."""
        finished = threading.Event()
        failure: list[BaseException] = []

        def push() -> None:
            try:
                self.checkpoint_manager.update_weights(global_steps=global_steps)
            except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
                failure.append(error)
            finally:
                finished.set()

        threading.Thread(target=push, name=f"{self.level}-weight-sync", daemon=True).start()
        while not finished.wait(watch_s):
            dead, _ = self._server_states(watch_s)
            if dead:
                raise self._servers_died(dead)
        if failure:
            dead, _ = self._server_states(watch_s)
            if dead:
                raise self._servers_died(dead) from failure[0]
            raise failure[0]

    def wake_up(self, global_steps: int) -> None:
        """Before generating: push the actor's weights into the servers if they changed or a sleep freed them.

        verl's naive push is the wake-up: it restores the servers' memory, loads the weights and restores the KV
        cache (vLLM's level-2 sleep discards the weights, so a server that slept is only usable after a push). Servers
        that slept keeping the actor's current weights (level 1) are woken without a push: verl's wake-up brings the
        weights back from host memory."""
        self.check_servers_alive()
        if not self.rollout_current:
            start = time.perf_counter()
            self.push_weights(global_steps)
            self.sync_seconds += time.perf_counter() - start
            self.weight_syncs += 1
            self.rollout_current = True
        elif not self.awake:
            self.checkpoint_manager.wake_up_replicas()
        self.awake = True

    def sleep(self, keep_weights: bool) -> None:
        """Free the servers' memory for training on their devices.

        In sleep mode the weights are discarded (vLLM level 2), unless ``keep_weights`` and the servers hold the
        actor's current weights: then they sleep at level 1 and :meth:`wake_up` needs no push. Without sleep mode
        the servers keep everything."""
        keep = self.sleeps and keep_weights and self.rollout_current
        vc.sleep_replicas(self.checkpoint_manager, keep_weights=keep)
        if self.sleeps:
            self.rollout_current, self.awake = keep, False

    def weights_changed(self) -> None:
        """The actor's weights changed (an update, a checkpoint load): the next :meth:`wake_up` pushes them."""
        self.rollout_current = False

    # ---------------------------------------------------------------- generation
    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, request_id: str) -> Any:
        """One response from this level's rollout server: verl ``TokenOutput`` (token ids and log-probs).

        Under ``rollout.full_determinism`` the request carries its own sampling seed (:func:`request_seed`), so its
        sample does not depend on the batch the server ran it in; ``request_id`` must then name the request uniquely
        within the run (the episode's ids name the step, the problem, the attempt and the turn)."""
        sampling = {
            "temperature": temperature,
            "top_p": self.config.rollout.top_p,
            "top_k": self.config.rollout.top_k,
            "max_tokens": max_tokens,
            "logprobs": True,
        }
        if self.config.rollout.get("full_determinism", False):
            sampling["seed"] = request_seed(self.config.rollout.seed, request_id)
        return await self.client.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling)

    # ---------------------------------------------------------------- training-side computations
    def _to_tensordict(self, batch: DataProto, **meta: Any):
        # log-probs are of softmax(logits / T), the distribution the rollout sampled from
        return to_padding_free(batch, temperature=self.config.rollout.temperature, **meta)

    def compute_log_prob(self, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor log-probs and entropies of the responses, each (B, R)."""
        ranked, rows, _ = for_ranks(batch, self.world_size)
        td = self._to_tensordict(ranked, calculate_entropy=True, compute_loss=False)
        output = self.worker_group.compute_log_prob(td)
        log_probs = vc.no_padding_2_padding(vc.tensordict_utils.get(output, "log_probs"), td)
        entropy = vc.no_padding_2_padding(vc.tensordict_utils.get(output, "entropy"), td)
        return log_probs.float()[rows], entropy.float()[rows]

    def compute_ref_log_prob(self, batch: DataProto) -> torch.Tensor:
        """Reference-model log-probs of the responses, (B, R): the base model's for a LoRA level."""
        ranked, rows, _ = for_ranks(batch, self.world_size)
        base = {"no_lora_adapter": True} if self.ref_in_actor else {}
        td = self._to_tensordict(ranked, calculate_entropy=False, compute_loss=False, **base)
        compute = self.worker_group.compute_log_prob if self.ref_in_actor else self.worker_group.compute_ref_log_prob
        output = compute(td)
        return vc.no_padding_2_padding(vc.tensordict_utils.get(output, "log_probs"), td).float()[rows]

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """One PPO/GRPO update over ``batch`` (needs ``old_log_probs`` and ``advantages``); returns metrics.

        The batch is padded to a multiple of the data-parallel size with masked rows (no loss, no gradient) and,
        with more than one rank, balanced over the ranks (``rank_tokens_max`` / ``rank_tokens_min`` in the metrics)
        with every optimizer step's rows mixing turns and lengths, shuffled with ``actor.data_loader_seed``
        (:mod:`agent_system.levels.balance`; ``actor.shuffle=true`` has verl reshuffle each rank's rows after that).
        """
        actor = self.config.actor
        mini_batch = mini_batch_size(
            padded_rows(len(batch), self.world_size), actor.ppo_mini_batch_size, self.world_size
        )
        batch, _, balance = for_ranks(batch, self.world_size, mini_batch, actor.data_loader_seed)
        batch.meta_info["multi_turn"] = False
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
        return flatten_metrics(vc.tensordict_utils.get(output, "metrics")) | (balance.metrics() if balance else {})

    def save_checkpoint(self, path: str, global_steps: int) -> None:
        self.worker_group.save_checkpoint(path, None, global_steps, None)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path, None, False)


def reference_is_base(view: DictConfig) -> bool:
    """Whether the level of ``view`` trains a LoRA adapter, so that its reference, when it needs one, is its actor with
    the adapter switched off (no reference model is built)."""
    return lora_rank(view.actor_rollout_ref.model) > 0


def to_padding_free(batch: DataProto, **meta: Any) -> Any:
    """verl's padding-free ``TensorDict`` of ``batch`` with ``meta`` attached, as verl's workers take it."""
    td = vc.left_right_2_no_padding(batch.to_tensordict())
    vc.tensordict_utils.assign_non_tensor(td, **meta)
    return td


def largest_divisor_at_most(total: int, limit: int) -> int:
    """verl's actor splits a batch into equal mini-batches; pick the largest size <= limit that divides it."""
    return next(size for size in range(min(total, max(limit, 1)), 0, -1) if total % size == 0)


def mini_batch_size(total: int, limit: int, world_size: int) -> int:
    """Rows per optimizer step for a batch of ``total`` rows (a multiple of ``world_size``) on ``world_size`` ranks.

    verl splits the batch across ranks, then each rank's share into equal mini-batches of ``size / world_size``
    rows: the size is ``world_size`` times a divisor of the per-rank share, the largest not above ``limit`` (at
    least one row per rank).
    """
    if total % world_size:
        raise ValueError(f"{total} rows cannot be split over {world_size} data-parallel ranks")
    per_rank = largest_divisor_at_most(total // world_size, max(limit // world_size, 1))
    return per_rank * world_size


def pad_to_multiple(batch: DataProto, divisor: int) -> tuple[DataProto, int]:
    """Pad ``batch`` to a multiple of ``divisor`` rows with masked copies of its first rows.

    Padding rows keep a valid sequence (verl's padding-free conversion needs one) but have ``response_mask`` and
    ``advantages`` zero, so they add nothing to a loss, a gradient or a token count. Returns (batch, rows added).
    """
    padded, pad = vc.pad_dataproto_to_divisor(batch, divisor)
    if pad:
        # the last two: methods/value_shaping's HL_LOG_PROB_WEIGHT, turn_kl.TURN_KL_COEF
        for key in ("response_mask", "advantages", "hl_log_prob_weight", "turn_kl_coef"):
            if key in padded.batch.keys():
                padded.batch[key][-pad:] = 0
    return padded, pad


def for_ranks(
    batch: DataProto, ranks: int, mini_batch: int | None = None, seed: int = 0
) -> tuple[DataProto, torch.Tensor, Balance | None]:
    """``batch`` as sent to ``ranks`` data-parallel ranks, and where each input row's output is.

    Padded to a multiple of ``ranks`` (:func:`pad_to_multiple`); with more than one rank, the rows are first put in
    canonical order (so the padding copies the same rows whatever the input order), then in the balanced order of
    :func:`agent_system.levels.balance.balanced_order`: each rank's rows dealt over the contiguous mini-batches of
    ``mini_batch`` rows verl cuts for an update (None: one piece, a log-prob or value batch) so that each holds the
    rank's turns (the batch's ``turn`` field, when it has one) in proportion and a spread of lengths, shuffled with
    ``seed``. Returns (the batch to send, ``rows``: an output of the sent batch indexed by ``rows`` is in the input's
    row order, padding dropped; the :class:`Balance`, None on one rank).
    """
    if ranks == 1:
        return batch, torch.arange(len(batch)), None
    canonical = torch.tensor(canonical_order(*_row_content(batch)), dtype=torch.long)
    ordered = batch.select_idxs(canonical)
    ordered.meta_info = dict(batch.meta_info)  # select_idxs shares the dict; the caller's must not change
    padded, _ = pad_to_multiple(ordered, ranks)
    pieces = len(padded) // mini_batch if mini_batch else 1
    turns = padded.non_tensor_batch["turn"] if "turn" in padded.non_tensor_batch else None
    strata = torch.as_tensor(turns.astype("int64")) if turns is not None else None
    balance: Balance = balanced_order(*_row_content(padded), ranks, pieces=pieces, seed=seed, strata=strata)
    padded.reorder(balance.order)
    # input row canonical[p] sits at canonical position p, which the balanced order puts at balance.inverse()[p]
    rows = torch.empty(len(batch), dtype=torch.long)
    rows[canonical] = balance.inverse()[: len(batch)]
    return padded, rows, balance


def padded_rows(rows: int, ranks: int) -> int:
    """Rows of a batch of ``rows`` once :func:`for_ranks` pads it for ``ranks`` ranks."""
    return -(-rows // ranks) * ranks


def _row_content(batch: DataProto) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(tokens per row, every tensor of the batch): what makes a row's place canonical; input ids first."""
    tensors = batch.batch
    keys = ["input_ids", *sorted(k for k in tensors.keys() if k != "input_ids")]
    return tensors["attention_mask"].sum(-1), [tensors[k] for k in keys]


def flatten_metrics(metrics: Any) -> dict[str, float]:
    """verl returns per-micro-batch metric lists; report their mean."""
    flat = {}
    for key, value in dict(metrics).items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) or torch.is_tensor(v)]
        if numbers:
            flat[key] = sum(numbers) / len(numbers)
    return flat
