"""Per-device GPU memory estimate of a run, from the models' ``config.json`` and the run's config (GPU issue, item 9).

For each level (and the lagged snapshot of the contrastive HL reward, on its own devices) the estimate gives what one
device holds, in bytes, as verl 0.9.1's FSDP engine and vLLM place it, from the level's own settings as its workers
receive them (:func:`level_memory`):

* **actor**: parameters in ``<tree>.actor.fsdp_config.model_dtype`` (verl loads a trained model in fp32 when unset),
  gradients in the same dtype (FSDP reduces in ``mixed_precision.reduce_dtype`` but keeps the sharded gradient in the
  parameter's dtype) and AdamW's two moments (``torch.optim.AdamW`` keeps them in the parameter's dtype): 16 bytes per
  parameter in fp32. All are sharded over the level's ranks (``mlmt.<level>_gpus`` under split placement,
  ``trainer.n_gpus_per_node × trainer.nnodes`` under colocated), or over ``fsdp_size`` ranks when it is smaller
  (HSDP). Gradients exist only during the level's update: verl's train-mode context frees them
  (``optimizer.zero_grad()``) when it ends. ``param_offload`` / ``optimizer_offload`` keep parameters / moments on the
  host between passes, but the train-mode context loads them back for the update (and eval mode the parameters for a
  log-prob pass); ``offload_policy`` (FSDP2's ``CPUOffloadPolicy``) keeps all three on the host, the optimizer step
  included. A frozen level (and the snapshot) is
  never updated: AdamW creates its moments at the first step and gradients appear at the first backward, so it holds
  parameters only. With LoRA (``<tree>.model.lora_rank`` > 0) verl wraps the model in PEFT: the parameters are the
  base's plus the adapter's (verl casts the adapter to the base's dtype), and only the adapter has gradients and
  AdamW moments (the base's parameters do not require a gradient, and AdamW creates state only for parameters that
  get one): :func:`trainable_parameters`.
* **logits**: the peak of the log-prob pass and of the update over the largest micro-batch of each level
  (:func:`logits_peak`): tokens × vocabulary × bytes per element, packed (``use_remove_padding=true``) at the token
  budget, padded (sdpa) at :data:`PADDED_FACTOR` × the budget. Without dynamic batching (``use_dynamic_bsz=false``)
  a micro-batch is the pass's rows per device (``…micro_batch_size_per_gpu``), each of up to the longest row
  (:func:`micro_batch`).
* **activations** of the same micro-batch (:func:`activation_bytes_per_token`): what autograd keeps for the backward,
  tokens × bytes per token. Per decoder layer and token (:meth:`ModelShape.layer_activation_bytes`, from the tensors
  transformers' Llama / Qwen2 decoder layer saves: both RMSNorms' fp32 input and 16-bit output, the attention's
  query, keys, values and output, the MLP's gate, up, SiLU and product). With ``<tree>.model.
  enable_gradient_checkpointing`` (verl's default; verl calls ``gradient_checkpointing_enable(use_reentrant=False)``
  and transformers checkpoints each ``GradientCheckpointingLayer``): every layer's input hidden state (layers × hidden
  × bytes) plus one layer recomputed in the backward; without it every layer's whole set. A log-prob pass runs
  without autograd: one layer's tensors at a time.
* **reference**: verl builds it ``forward_only`` and always offloads it to the host (``CPUOffload`` under ``fsdp``,
  ``CPUOffloadPolicy`` under ``fsdp2``); it uses no device memory between forwards (host bytes are shown). A LoRA
  level has none: its reference is the actor with the adapter switched off.
* **critic** (a level in ``advantages.critic_levels``: its estimator registered with ``critic=True``, and it
  trains): like the actor, from ``<critic>.fsdp`` and the critic model's ``config.json`` (a token-classification
  head of one label instead of the LM head). Its values pass and its update hold the activations of their largest
  micro-batch (``<critic>.forward_max_token_len_per_gpu`` / ``ppo_max_token_len_per_gpu`` tokens), counted as the
  actor's from ``<critic>.model``'s padding and gradient checkpointing; its values are one number a token.
* **vLLM**: ``rollout.gpu_memory_utilization × device memory`` per device of a replica, holding the weights
  (``rollout.dtype``, split over ``tensor_model_parallel_size``) and the KV cache; with
  ``engine_kwargs.vllm.kv_cache_memory_bytes`` set, vLLM ignores the fraction and the KV cache is that size. The KV
  capacity in sequences of ``max_model_len`` tokens: KV bytes / (K and V × layers × kv heads per device × head dim ×
  the KV dtype's bytes (``engine_kwargs.vllm.kv_cache_dtype``, else ``rollout.dtype``)) / ``max_model_len``.

A device's estimate is the largest of the phases of a step on it (both levels on every device under colocated
placement; each level alone on its devices under split): generation (every level's state between passes and its
vLLM engine, all awake at once, and verl's weight-transfer bucket), and each level's log-prob pass and update (the
state between passes, what the pass loads and creates, its logits peak and activations, and the vLLM engines that do
not sleep: ``rollout.free_cache_engine`` frees them outside generation, except a frozen level's under split). Every
phase also holds the processes' own memory (:func:`device_overheads`): a CUDA context per process on the device
(:data:`CUDA_CONTEXT`) and NCCL's buffers in every process of a communicator of more than one rank
(:data:`NCCL_BUFFERS`). vLLM's activation profile and the allocator's fragmentation are not counted: a device's
sums must stay within :data:`MARGIN` of its size (``usable``). On a machine without a GPU the device size is not
known: the plan then gives the figures and the smallest device the sum fits on with the margin, or checks
``mlmt.plan_device_gib``. A peak above the usable memory stops the run at start-up (:func:`refuse_overcommit`) unless
``mlmt.plan_allow_overcommit``; before that, padded passes get the largest token budgets that fit
(:func:`padded_budgets`).

Print it with the run plan: ``python -m verl.trainer.main_mlmt mlmt.plan_only=true mlmt.plan_device_gib=80``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from agent_system.config import CRITIC_TREES, POLICY_TREES, ConfigError, frozen_levels, has_hl, level_view
from agent_system.trainer.advantages import critic_levels

GIB = 2**30
DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "float": 4, "32": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
    "auto": 2,  # vLLM's rollout.dtype=auto: fp16 for fp32 and fp16 models, bf16 for bf16 ones
}  # fmt: skip
MARGIN = 0.10  # of each device kept free: vLLM's activation profile, allocator fragmentation, the estimate's error
EXCLUDED = f"vLLM's activation profile and fragmentation are not counted: the sums keep a {MARGIN * 100:g} % margin"
# Each process that uses a device holds a CUDA context there (the driver's and the CUDA libraries' kernels and
# handles): about 0.5 GiB with torch 2.x and lazy module loading on an H100-class GPU.
CUDA_CONTEXT = 2**29
# NCCL's buffers in each process of a communicator of more than one rank: NCCL_BUFFSIZE (4 MiB, the Simple protocol)
# plus the LL128 (~4.6 MiB) and LL (256 KiB) buffers, per channel and peer, with up to 32 channels and two ring peers
# on NVLink: about 0.6 GiB, rounded up to 1 GiB for the tree and NVLS buffers (NCCL's environment-variable docs).
NCCL_BUFFERS = 2**30


class MemoryUnavailable(ValueError):
    """The estimate cannot be made (a model folder without ``config.json``); the message says which key."""


def dtype_bytes(name: object, key: str) -> int:
    """Bytes of one element of the dtype ``name`` (verl's and vLLM's spellings; ``torch.`` prefix allowed)."""
    text = str(name).lower().removeprefix("torch.")
    if text not in DTYPE_BYTES:
        raise ConfigError(f"{key}={name}: not a dtype the memory estimate knows ({', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[text]


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-shaped decoder that memory depends on, from its ``config.json``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    attention_bias: bool  # q/k/v biases (Qwen2)

    @classmethod
    def from_hf_config(cls, hf: dict, source: str) -> ModelShape:
        needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [name for name in needed if name not in hf]
        if missing:
            raise MemoryUnavailable(f"{source} has no {', '.join(missing)}: not a decoder config the estimate reads")
        heads = int(hf["num_attention_heads"])
        return cls(
            hidden=int(hf["hidden_size"]),
            layers=int(hf["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            intermediate=int(hf["intermediate_size"]),
            vocab=int(hf["vocab_size"]),
            tied=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", hf.get("model_type") == "qwen2")),
        )

    def _body(self) -> int:
        """Embeddings, decoder layers and the final norm."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv + ((q + 2 * kv) if self.attention_bias else 0)
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden  # + gate/up/down, two norms
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden

    @property
    def parameters(self) -> int:
        """Of the causal LM (``AutoModelForCausalLM``): an LM head of its own unless the embeddings are tied."""
        return self._body() + (0 if self.tied else self.vocab * self.hidden)

    @property
    def critic_parameters(self) -> int:
        """Of verl's value model (``AutoModelForTokenClassification``, one label): a ``score`` head with a bias."""
        return self._body() + self.hidden + 1

    def linear_layers(self) -> list[tuple[str, int, int]]:
        """``(module name, in_features, out_features)`` of every linear layer of the causal LM, named as transformers
        names them in Llama and Qwen2 (the names PEFT's ``target_modules`` match against); ``lm_head`` last."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        sizes = {
            "self_attn.q_proj": (self.hidden, q),
            "self_attn.k_proj": (self.hidden, kv),
            "self_attn.v_proj": (self.hidden, kv),
            "self_attn.o_proj": (q, self.hidden),
            "mlp.gate_proj": (self.hidden, self.intermediate),
            "mlp.up_proj": (self.hidden, self.intermediate),
            "mlp.down_proj": (self.intermediate, self.hidden),
        }
        layers = [
            (f"model.layers.{index}.{name}", fan_in, fan_out)
            for index in range(self.layers)
            for name, (fan_in, fan_out) in sizes.items()
        ]
        return [*layers, ("lm_head", self.hidden, self.vocab)]

    def lora_parameters(self, rank: int, target_modules: object, exclude_modules: object = None, key: str = "") -> int:
        """Parameters of a LoRA adapter of rank ``rank``: ``rank × (in_features + out_features)`` (A and B) for each
        linear layer that ``target_modules`` selects and ``exclude_modules`` does not, selected as PEFT selects them:
        ``"all-linear"`` is every linear layer but the output layer (``lm_head``); another string is a regular
        expression matched against the whole module name; a list holds names matched as the whole name or its last
        dotted parts.

        Raises:
            MemoryUnavailable: A listed name (or the expression) selects no linear layer of this decoder (PEFT
                would refuse it, or the model is not Llama-shaped); the message names ``key``.
        """
        layers = self.linear_layers()
        if isinstance(target_modules, str) and target_modules.lower() == "all-linear":
            chosen = [layer for layer in layers if layer[0] != "lm_head"]
        elif isinstance(target_modules, str):
            chosen = [layer for layer in layers if re.fullmatch(target_modules, layer[0])]
        else:
            names = [str(name) for name in target_modules or []]
            unmatched = [name for name in names if not any(_name_matches(layer[0], name) for layer in layers)]
            if unmatched:
                raise MemoryUnavailable(
                    f"{key}.target_modules: {unmatched} name no linear layer of a Llama / Qwen2 decoder (the "
                    "estimate knows q/k/v/o_proj, gate/up/down_proj and lm_head)"
                )
            chosen = [layer for layer in layers if any(_name_matches(layer[0], name) for name in names)]
        if isinstance(exclude_modules, str):
            chosen = [layer for layer in chosen if not re.fullmatch(exclude_modules, layer[0])]
        elif exclude_modules:
            chosen = [layer for layer in chosen if not any(_name_matches(layer[0], str(x)) for x in exclude_modules)]
        if not chosen:
            raise MemoryUnavailable(f"{key}.target_modules={target_modules!r} selects no linear layer of the model")
        return sum(rank * (fan_in + fan_out) for _, fan_in, fan_out in chosen)

    def kv_bytes_per_token(self, element_bytes: int, tensor_parallel: int) -> int:
        """K and V of one token on one device of a replica (vLLM replicates kv heads when TP exceeds them)."""
        return 2 * self.layers * max(self.kv_heads // tensor_parallel, 1) * self.head_dim * element_bytes

    def layer_activation_bytes(self, element_bytes: int, packed: bool, row: int) -> int:
        """Bytes autograd keeps per token for the backward of one decoder layer, as transformers' Llama / Qwen2
        layer computes in ``element_bytes`` (the FSDP engine's ``mixed_precision.param_dtype``), in rows of up to
        ``row`` tokens:

        * each of the two RMSNorms: its input cast to fp32 (4 × hidden) and its fp32 reciprocal root (4), and its
          16-bit output (kept by the weight's product), whose product is the projections' input (2 × b × hidden);
        * attention: the query (b × heads × head_dim), keys and values as sdpa receives them, its output (kept by
          ``o_proj``) and its fp32 log-sum-exp (4 × heads). Packed (flash-attn, grouped-query natively) keys and
          values have the kv heads; padded, an attention mask is given, transformers repeats them to every query
          head (``repeat_kv``) and sdpa keeps the layer's copy of the mask (b × ``row`` per token);
        * MLP: the gate's and the up projection's outputs, the SiLU's output and the product (4 × b × intermediate).

        ``tests/unit/trainer/test_memory_estimate_on_cpu.py`` checks it against the tensors autograd saves.
        """
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim if packed else q
        norms = 2 * ((4 + 2 * element_bytes) * self.hidden + 4)
        attention = element_bytes * (2 * q + 2 * kv + (0 if packed else row)) + 4 * self.heads
        return norms + attention + 4 * element_bytes * self.intermediate


def activation_bytes_per_token(
    shape: ModelShape, element_bytes: int, packed: bool, pass_name: str, checkpointing: bool, row: int
) -> int:
    """Activation bytes per token of a micro-batch in a pass (``update`` or ``log_prob``), beside its logits.

    Update with gradient checkpointing: every layer's input hidden state (layers × hidden × b, what the checkpoint
    keeps), the layer the backward recomputes (:meth:`ModelShape.layer_activation_bytes`) and the final norm's
    tensors (both counted beside the logits, though the backward frees them before the first recompute: an upper
    bound by one layer). Without checkpointing: every layer's set and the final norm's. A log-prob pass (no autograd)
    holds one layer's tensors at a time, bounded by the same set. ``row``: the longest row (prompt + response
    budget), which a padded micro-batch's attention mask spans."""
    layer = shape.layer_activation_bytes(element_bytes, packed, row)
    if pass_name == "log_prob":
        return layer
    final_norm = (4 + 2 * element_bytes) * shape.hidden + 4
    if checkpointing:
        return shape.layers * element_bytes * shape.hidden + layer + final_norm
    return shape.layers * layer + final_norm


def _name_matches(module: str, name: str) -> bool:
    return module == name or module.endswith(f".{name}")


@dataclass(frozen=True)
class Trainable:
    """What a level's optimizer updates: the whole model, or a LoRA adapter over a frozen base."""

    held: int  # parameters the actor holds (base + adapter with LoRA)
    trained: int  # parameters with gradients and AdamW moments
    lora: str  # "" for full fine-tuning, else e.g. "LoRA r 16, α 32, target_modules all-linear"


def trainable_parameters(model: DictConfig, shape: ModelShape, key: str) -> Trainable:
    """The parameters a policy built from ``model`` (``<tree>.model``, verl's keys) holds and trains.

    ``lora_rank`` > 0: an adapter of that rank on ``target_modules`` minus ``exclude_modules`` (verl passes the three
    to PEFT's ``LoraConfig``), or, with ``lora_adapter_path``, the rank and modules of that adapter's
    ``adapter_config.json`` (verl loads it in place of a new one).

    Raises:
        MemoryUnavailable: The adapter cannot be counted (a ``lora_adapter_path`` without a local
            ``adapter_config.json``, ``target_parameters``, a name that selects no linear layer).
    """
    rank = int(model.get("lora_rank", 0) or 0)
    if rank <= 0:
        return Trainable(held=shape.parameters, trained=shape.parameters, lora="")
    settings = {
        "r": rank,
        "lora_alpha": model.get("lora_alpha"),
        "target_modules": model.get("target_modules"),
        "exclude_modules": model.get("exclude_modules"),
    }
    source = f"{key}.lora_rank"
    if model.get("lora_adapter_path"):
        adapter = Path(str(model.lora_adapter_path)).expanduser() / "adapter_config.json"
        if not adapter.is_file():
            raise MemoryUnavailable(f"{key}.lora_adapter_path={model.lora_adapter_path}: no adapter_config.json there")
        saved = json.loads(adapter.read_text())
        settings = {name: saved.get(name, settings[name]) for name in settings}
        source = str(adapter)
    if model.get("target_parameters"):
        raise MemoryUnavailable(f"{key}.target_parameters: adapters on parameters are not counted by the estimate")
    targets = settings["target_modules"]
    targets = OmegaConf.to_container(targets) if OmegaConf.is_config(targets) else targets
    exclude = settings["exclude_modules"]
    exclude = OmegaConf.to_container(exclude) if OmegaConf.is_config(exclude) else exclude
    adapter_parameters = shape.lora_parameters(int(settings["r"]), targets, exclude, key)
    target_text = targets if isinstance(targets, str) else ",".join(targets)
    return Trainable(
        held=shape.parameters + adapter_parameters,
        trained=adapter_parameters,
        lora=f"LoRA r {settings['r']}, α {settings['lora_alpha']}, target_modules {target_text} (from {source})",
    )


def read_shape(path: str, key: str) -> ModelShape:
    config_file = Path(str(path)).expanduser() / "config.json"
    if not config_file.is_file():
        raise MemoryUnavailable(f"{key}={path}: no config.json there (the path is resolved at start-up)")
    return ModelShape.from_hf_config(json.loads(config_file.read_text()), str(config_file))


# ------------------------------------------------------------------------------------------------------------ figures
@dataclass
class LevelMemory:
    """What one device of a level holds (bytes); host bytes are per rank."""

    level: str  # ll, hl, snapshot
    tree: str  # the policy's config tree (actor_rollout_ref, hl)
    model: str
    parameters: int
    trained_parameters: int  # with gradients and AdamW moments: all, or a LoRA adapter's
    lora: str  # "" for full fine-tuning
    ranks: int  # devices of the level
    shards: int  # FSDP shards of the actor's state (ranks, or fsdp_size when smaller)
    frozen: bool  # never updated: parameters only
    actor_dtype: str
    actor_parameters: int  # on the device during the level's update (param_offload loads them back for it)
    actor_gradients: int  # during the update only
    actor_optimizer: int  # during the update (optimizer_offload loads the moments back for it)
    actor_resident_parameters: int  # on the device between passes (0 offloaded)
    actor_resident_optimizer: int
    actor_host: int  # offloaded actor state between passes
    offload: list[str]  # the offload keys that act
    unset_offload: dict[str, str]  # the actor's offload keys not set: {"param_offload": "<key>=true", ...}
    reference_host: int  # verl keeps the reference on the host (0 without a reference)
    critic_tree: str  # "" without a critic
    critic_parameters: int  # 0 without a critic
    critic: int  # parameters + gradients + AdamW moments on the device during its update
    critic_resident: int  # between passes
    critic_host: int
    critic_unset_offload: dict[str, str]
    critic_loaded: int  # the critic's parameters its values pass loads back (param_offload)
    critic_passes: list[LogitsPeak]  # its values pass and update: activations (its "logits" are one value a token)
    logits: list[LogitsPeak]  # the level's passes: log-probs (not the snapshot), the update (a level that trains)
    vllm_weights: int  # per device of a replica
    tensor_parallel: int  # devices of a vLLM replica's tensor-parallel group (NCCL above 1)
    bucket: int  # verl's weight-transfer bucket on the actor's device during the push
    bucket_key: str  # the key that sizes it
    vllm_fraction: float | None  # gpu_memory_utilization, when it sizes vLLM (None: kv_cache_memory_bytes does)
    vllm_budget: int | None  # None: the device size is not known
    vllm_sleeps: bool  # vLLM frees its memory outside generation (rollout.free_cache_engine; not a frozen split level)
    kv_bytes_per_token: int
    kv_cache: int | None
    kv_tokens: int | None
    kv_sequences: int | None  # of max_model_len tokens, per replica
    max_model_len: int


@dataclass
class Part:
    """One term of a device's sum: bytes, or a share of the device (vLLM's gpu_memory_utilization)."""

    what: str  # e.g. "HL AdamW moments"
    bytes: int
    fraction: float  # of the device
    keys: list[str]  # what lowers it, e.g. "hl.actor.fsdp_config.optimizer_offload=true"

    def size(self, device: int | None) -> int | None:
        if not self.fraction:
            return self.bytes
        return None if device is None else self.bytes + int(self.fraction * device)


@dataclass
class Phase:
    """What a device holds at once in one phase of a step: generation, or one level's log-prob or update pass."""

    name: str  # e.g. "generation", "HL update"
    parts: list[Part]
    fixed: int
    fraction: float
    total: int | None
    logits: LogitsPeak | None  # the pass's logits peak (None: generation, a critic's update)

    @property
    def smallest_device(self) -> int | None:
        """The smallest device whose usable memory (:data:`MARGIN` kept free) holds the phase."""
        room = 1 - MARGIN - self.fraction
        return math.ceil(self.fixed / room) if room > 0 else None


@dataclass
class DeviceSum:
    """The peak on each device of one group of devices: the largest of its phases."""

    devices: str  # e.g. "each of the 8 shared devices (mlmt.placement=colocated)"
    levels: list[str]
    phases: list[Phase]
    peak: str  # the phase with the largest sum (without the device size: the one needing the largest device)
    fixed: int  # of the peak phase
    fraction: float  # of the device, taken by vLLM engines sized by gpu_memory_utilization (peak phase)
    total: int | None
    fits: bool | None  # total within the usable memory (the device less MARGIN)
    smallest_device: int | None  # the smallest device every phase fits on (None: vLLM's shares alone fill it)
    scale_keys: list[str]  # more devices for the level(s): "raise mlmt.hl_gpus", ...
    overheads: list[Part]  # the processes' CUDA contexts and NCCL buffers, in every phase (device_overheads)


@dataclass
class MemoryPlan:
    device: int | None
    device_source: str
    usable: int | None  # the device less MARGIN: what every sum must stay within
    levels: dict[str, LevelMemory]
    sums: list[DeviceSum]
    excluded: str = EXCLUDED
    margin: float = MARGIN
    notices: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------------------ config
def level_ranks(config: DictConfig, level: str) -> int:
    if config.mlmt.placement == "split":
        return int(config.mlmt[f"{'ll' if level == 'snapshot' else level}_gpus"])
    if level == "snapshot":
        return int(config.mlmt.ll_gpus)
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.get("nnodes", 1) or 1)


def fsdp_shards(engine: DictConfig, ranks: int) -> int:
    """verl's device mesh: one FSDP group over all ranks, or HSDP groups of ``fsdp_size`` when it is smaller."""
    size = int(engine.get("fsdp_size", -1) or -1)
    return size if 0 < size < ranks else ranks


def _trained_state(
    engine: DictConfig, key: str, parameters: int, ranks: int, trains: bool, trained: int | None = None
) -> dict:
    """Device and host bytes of a trained model's parameters, gradients and AdamW moments under ``engine``;
    ``trained`` of the ``parameters`` get gradients and moments (all when None; a LoRA adapter's otherwise).

    ``update``: what one device holds during the model's update. verl's train-mode context loads what
    ``param_offload`` / ``optimizer_offload`` moved to the host back onto the device for the update, so only
    ``offload_policy`` (FSDP2's ``CPUOffloadPolicy``: parameters, gradients and the optimizer step on the host) keeps
    them off it. ``resident``: what it holds between passes, beside vLLM: gradients are freed at the end of every
    update (``optimizer.zero_grad()`` on leaving train mode, before any offload), offloaded parts are on the host.
    """
    dtype = engine.get("model_dtype") or "fp32"
    size = dtype_bytes(dtype, f"{key}.model_dtype")
    shards = fsdp_shards(engine, ranks)
    shard = -(-size * parameters // shards)  # rounded up, as FSDP pads the last shard
    trained_shard = shard if trained is None else -(-size * trained // shards)
    state = {
        "parameters": shard,
        "gradients": trained_shard if trains else 0,
        "optimizer": 2 * trained_shard if trains else 0,
    }
    policy = bool(engine.get("offload_policy", False))
    between = {
        "parameters": not (policy or engine.get("param_offload", False)),
        "optimizer": not (policy or engine.get("optimizer_offload", False)),
    }
    keys = [f"{key}.{name}=true" for name in ("offload_policy", "param_offload", "optimizer_offload")
            if engine.get(name, False)]  # fmt: skip
    return {
        "dtype": str(dtype),
        "shards": shards,
        "update": {part: 0 if policy else value for part, value in state.items()},
        "resident": {part: state[part] if on_device else 0 for part, on_device in between.items()},
        "host": sum(state[part] for part, on_device in between.items() if not on_device),
        "keys": keys,
        "unset": {
            name: f"{key}.{name}=true"
            for name in ("offload_policy", "param_offload", "optimizer_offload")
            if not engine.get(name, False)
        },
    }


# The logits peak of a pass over one micro-batch, per (token, vocabulary entry), in copies of the logits' dtype
# (``b`` bytes: the FSDP engine's ``mixed_precision.param_dtype``, bf16 by default) as verl 0.9.1's FSDP engine
# computes log-probs and entropy (docs/RUN_PLAN.md, "Logits peak"): the logits and their temperature-scaled copy in
# every pass, the logits' gradient in the update; padded rows (sdpa, ``use_remove_padding=false``) add the copy of
# the real tokens' logits and, in the update, its log-softmax rows kept for the backward. The entropy (every log-prob
# pass; the update when ``entropy_coeff`` != 0): chunked (``entropy_from_logits_with_chunking``, packed only) its
# fp32 chunks are transient without autograd (ENTROPY_CHUNK rows × 12 bytes) and kept for the backward in the update
# (fp32 copy and softmax: 8 bytes); unchunked its softmax and product are two more copies.
LOGITS_COPIES = {("packed", "update"): 3, ("packed", "log_prob"): 2, ("padded", "update"): 5, ("padded", "log_prob"): 3}
ENTROPY_COPIES = 2  # unchunked entropy: softmax and its product with the logits, in the logits' dtype
ENTROPY_FP32_BYTES = 8  # chunked entropy under autograd: each chunk's fp32 copy and softmax, kept for the backward
ENTROPY_CHUNK = 2048  # verl's entropy_from_logits_chunk_size
PADDED_FACTOR = 2  # padded tokens of a micro-batch per budget token (verl's partitioner: 1.6-1.75× on MATH's shapes)


@dataclass(frozen=True)
class LogitsPeak:
    """The token-dependent peak of one pass over the largest micro-batch of a level (one device): its logits and its
    activations, both proportional to the micro-batch's tokens."""

    pass_name: str  # "update" or "log_prob"
    key: str  # the token budget's key
    budget: int  # its value
    tokens: int  # of the largest micro-batch: the budget packed, PADDED_FACTOR × it padded, × longest_row in rows
    layout: str  # "packed" or "padded"
    vocab: int
    per_token: int  # logits bytes per token of the micro-batch
    bytes: int  # of the logits
    longest_row: int  # prompt + response budget: the least budget verl accepts
    activations_per_token: int  # activation_bytes_per_token
    checkpointing: bool  # <tree>.model.enable_gradient_checkpointing
    checkpointing_key: str
    rows: bool = False  # the budget counts rows of up to longest_row tokens (use_dynamic_bsz=false), not tokens

    @property
    def tokens_per_unit(self) -> int:
        """Tokens of the micro-batch per unit of its budget (a row's longest, or a budget token's)."""
        return tokens_per_unit(self.rows, self.layout == "packed", self.longest_row)

    @property
    def least(self) -> int:
        """The least budget verl accepts: one row, or a token budget of the longest row."""
        return 1 if self.rows else self.longest_row

    @property
    def activations(self) -> int:
        return self.tokens * self.activations_per_token

    def at_budget(self, budget: int) -> int:
        """Logits and activations of the pass's largest micro-batch with a budget (tokens or rows) of ``budget``."""
        tokens = budget * self.tokens_per_unit
        return self.bytes - self.tokens * self.per_token + tokens * (self.per_token + self.activations_per_token)


def tokens_per_unit(rows: bool, packed: bool, longest_row: int) -> int:
    """Tokens of a micro-batch per unit of its budget: ``longest_row`` per row (``rows``), one per budget token
    packed, :data:`PADDED_FACTOR` padded."""
    return longest_row if rows else 1 if packed else PADDED_FACTOR


def logits_peak(
    pass_name: str,
    key: str,
    budget: int,
    packed: bool,
    vocab: int,
    element_bytes: int,
    entropy: bool,
    chunked: bool,
    longest_row: int,
    activations_per_token: int,
    checkpointing: tuple[bool, str],
    rows: bool = False,
) -> LogitsPeak:
    """The logits peak of a pass (``update`` or ``log_prob``) with ``budget`` tokens per micro-batch (``rows``:
    ``budget`` rows, each up to ``longest_row`` tokens, packed or padded): ``tokens × vocab × per-element bytes``
    (the constants above); ``entropy``: the pass computes it. ``activations_per_token``
    (:func:`activation_bytes_per_token`) and ``checkpointing`` (whether it is on, its key) describe the activations
    beside the logits."""
    layout = "packed" if packed else "padded"
    tokens = budget * tokens_per_unit(rows, packed, longest_row)
    copies = LOGITS_COPIES[layout, pass_name]
    fp32, transient = 0, 0
    if entropy and packed and chunked:
        if pass_name == "update":
            fp32 = ENTROPY_FP32_BYTES
        else:
            transient = 12 * ENTROPY_CHUNK * vocab  # one chunk's fp32 copy, softmax and product
    elif entropy:
        copies += ENTROPY_COPIES
    per_token = vocab * (copies * element_bytes + fp32)
    return LogitsPeak(pass_name, key, budget, tokens, layout, vocab, per_token, tokens * per_token + transient,
                      longest_row, activations_per_token, *checkpointing, rows)  # fmt: skip


def micro_batch(tree: DictConfig, name: str, dynamic: str, tokens: str, rows: str, ranks: int) -> tuple[str, int, bool]:
    """``(key, budget, rows)``: the setting that sizes a pass's micro-batches in ``tree`` (named ``name``), as verl
    reads it. ``dynamic`` (``use_dynamic_bsz``) on: the token budget ``tokens``. Off: ``rows`` rows per device (its
    global form without ``_per_gpu`` divided over the ``ranks``, as verl does when only that is set).

    Raises:
        MemoryUnavailable: Neither row count is set while ``dynamic`` is off (verl refuses that too).
    """
    if OmegaConf.select(tree, dynamic, default=False):
        return f"{name}.{tokens}", int(OmegaConf.select(tree, tokens)), False
    per_device = OmegaConf.select(tree, rows, default=None)
    if per_device is None and OmegaConf.select(tree, rows.removesuffix("_per_gpu"), default=None) is not None:
        per_device = int(OmegaConf.select(tree, rows.removesuffix("_per_gpu"))) // ranks
    if per_device is None:
        raise MemoryUnavailable(
            f"{name}.{dynamic}=false and {name}.{rows} is not set: verl needs a micro-batch size without dynamic "
            f"batching (or set {name}.{dynamic}=true and {name}.{tokens})"
        )
    return f"{name}.{rows}", int(per_device), True


def level_memory(
    config: DictConfig,
    level: str,
    device: int | None,
    reference: bool,
    critic: bool,
    frozen: bool,
) -> LevelMemory:
    """The :class:`LevelMemory` of ``level`` (``ll``, ``hl``, or ``snapshot``: the LL's model, never updated).

    Its settings are read from the level's view (:func:`~agent_system.config.level_view`), the config its workers
    receive: verl's defaults interpolate ``actor_rollout_ref.*`` (``rollout.log_prob_max_token_len_per_gpu`` is
    ``${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}``), which is the LL's tree in the full
    config and the level's own in its view. Keys are named as the full config names them (``hl.…``).
    """
    tree_name = POLICY_TREES["ll" if level == "snapshot" else level]
    view = level_view(config, "ll" if level == "snapshot" else level)
    tree = view.actor_rollout_ref
    shape = read_shape(tree.model.path, f"{tree_name}.model.path")
    ranks = level_ranks(config, level)
    trainable = trainable_parameters(tree.model, shape, f"{tree_name}.model")
    actor = _trained_state(tree.actor.fsdp_config, f"{tree_name}.actor.fsdp_config", trainable.held, ranks,
                           trains=not frozen, trained=trainable.trained)  # fmt: skip
    reference_host = 0
    if reference:
        ref_engine = tree.ref.fsdp_config
        ref_dtype = ref_engine.get("model_dtype") or "bf16"  # verl: bf16 for a forward-only model without one
        reference_host = (
            dtype_bytes(ref_dtype, f"{tree_name}.ref.fsdp_config.model_dtype")
            * shape.parameters
            // fsdp_shards(ref_engine, ranks)
        )
    rollout = tree.rollout
    response = config.data.max_response_length if level == "ll" else rollout.response_length
    longest = int(config.data.max_prompt_length + response)  # a row's prompt and response budgets
    critic_name, critic_parameters, critic_state, critic_passes = "", 0, None, []
    if critic:
        critic_name = CRITIC_TREES[level]
        critic_shape = read_shape(view.critic.model.path, f"{critic_name}.model.path")
        critic_parameters = critic_shape.critic_parameters
        critic_state = _trained_state(view.critic.fsdp, f"{critic_name}.fsdp", critic_parameters, ranks,
                                      trains=True)  # fmt: skip
        actor["keys"] += critic_state["keys"]
        critic_passes = _critic_passes(view.critic, critic_name, critic_shape, longest, frozen, ranks)
    logits = []
    if level != "snapshot":  # the snapshot only generates
        element = dtype_bytes(
            OmegaConf.select(tree, "actor.fsdp_config.mixed_precision.param_dtype", default=None) or "bf16",
            f"{tree_name}.actor.fsdp_config.mixed_precision.param_dtype",
        )
        packed, chunked = bool(tree.model.use_remove_padding), bool(tree.actor.entropy_from_logits_with_chunking)
        passes = [("log_prob", ("rollout.log_prob_use_dynamic_bsz", "rollout.log_prob_max_token_len_per_gpu",
                                "rollout.log_prob_micro_batch_size_per_gpu"), True)]  # fmt: skip
        if not frozen:
            entropy = bool(tree.actor.get("calculate_entropy", False)) or float(tree.actor.entropy_coeff) != 0
            passes.append(("update", ("actor.use_dynamic_bsz", "actor.ppo_max_token_len_per_gpu",
                                      "actor.ppo_micro_batch_size_per_gpu"), entropy))  # fmt: skip
        checkpointing = (bool(tree.model.enable_gradient_checkpointing),
                         f"{tree_name}.model.enable_gradient_checkpointing")  # fmt: skip
        for name, setting, entropy in passes:
            key, budget, rows = micro_batch(tree, tree_name, *setting, ranks)  # the level's own (docstring)
            activations = activation_bytes_per_token(shape, element, packed, name, checkpointing[0], longest)
            logits.append(logits_peak(name, key, budget, packed, shape.vocab, element, entropy, chunked, longest,
                                      activations, checkpointing, rows))  # fmt: skip
    tensor_parallel = int(rollout.tensor_model_parallel_size)
    weights = dtype_bytes(rollout.dtype, f"{tree_name}.rollout.dtype") * shape.parameters // tensor_parallel
    kv_dtype = OmegaConf.select(rollout, "engine_kwargs.vllm.kv_cache_dtype", default=None)
    kv_key = f"{tree_name}.rollout.engine_kwargs.vllm.kv_cache_dtype"
    if kv_dtype in (None, "auto"):
        kv_dtype, kv_key = rollout.dtype, f"{tree_name}.rollout.dtype"
    per_token = shape.kv_bytes_per_token(dtype_bytes(kv_dtype, kv_key), tensor_parallel)
    max_model_len = int(rollout.max_model_len or rollout.prompt_length + rollout.response_length)
    fixed_kv = OmegaConf.select(rollout, "engine_kwargs.vllm.kv_cache_memory_bytes", default=None)
    if fixed_kv is not None:
        fraction, kv_cache = None, int(fixed_kv)
        budget = weights + kv_cache
    else:
        fraction = float(rollout.gpu_memory_utilization)
        budget = None if device is None else int(fraction * device)
        kv_cache = None if budget is None else max(budget - weights, 0)
    tokens = None if kv_cache is None else kv_cache // per_token
    # a level without updates under split never sleeps (weight_sync.sleeps_for_training): its devices hold no training
    keep_awake = level != "snapshot" and frozen and config.mlmt.placement == "split"
    return LevelMemory(
        level=level,
        tree=tree_name,
        model=str(tree.model.path),
        parameters=shape.parameters,
        trained_parameters=0 if frozen else trainable.trained,
        lora=trainable.lora,
        ranks=ranks,
        shards=actor["shards"],
        frozen=frozen,
        actor_dtype=actor["dtype"],
        actor_parameters=actor["update"]["parameters"],
        actor_gradients=actor["update"]["gradients"],
        actor_optimizer=actor["update"]["optimizer"],
        actor_resident_parameters=actor["resident"]["parameters"],
        actor_resident_optimizer=actor["resident"]["optimizer"],
        actor_host=actor["host"],
        offload=actor["keys"],
        unset_offload=actor["unset"],
        reference_host=reference_host,
        critic_tree=critic_name,
        critic_parameters=critic_parameters,
        critic=sum(critic_state["update"].values()) if critic_state else 0,
        critic_resident=sum(critic_state["resident"].values()) if critic_state else 0,
        critic_host=critic_state["host"] if critic_state else 0,
        critic_unset_offload=critic_state["unset"] if critic_state else {},
        critic_loaded=critic_state["update"]["parameters"] - critic_state["resident"]["parameters"] if critic else 0,
        critic_passes=critic_passes,
        logits=logits,
        vllm_weights=weights,
        tensor_parallel=tensor_parallel,
        bucket=int(rollout.checkpoint_engine.update_weights_bucket_megabytes) << 20,  # verl's bucket_size
        bucket_key=f"{tree_name}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        vllm_fraction=fraction,
        vllm_budget=budget,
        vllm_sleeps=bool(rollout.free_cache_engine) and not keep_awake,
        kv_bytes_per_token=per_token,
        kv_cache=kv_cache,
        kv_tokens=tokens,
        kv_sequences=None if tokens is None else tokens // max_model_len,
        max_model_len=max_model_len,
    )


def _critic_passes(
    critic: DictConfig, name: str, shape: ModelShape, longest: int, frozen: bool, ranks: int
) -> list[LogitsPeak]:
    """The critic's values pass (``<critic>.forward_max_token_len_per_gpu`` tokens a micro-batch, or
    ``forward_micro_batch_size_per_gpu`` rows without dynamic batching; no autograd) and, unless the level is frozen,
    its update (``ppo_max_token_len_per_gpu`` / ``ppo_micro_batch_size_per_gpu``): the activations of the largest
    micro-batch, as the actor's (:func:`activation_bytes_per_token`, from ``<critic>.model``'s padding and gradient
    checkpointing and ``<critic>.fsdp.mixed_precision.param_dtype``). Its head gives one value a token: its
    "logits" are a vocabulary of one."""
    element = dtype_bytes(
        OmegaConf.select(critic, "fsdp.mixed_precision.param_dtype", default=None) or "bf16",
        f"{name}.fsdp.mixed_precision.param_dtype",
    )
    packed = bool(critic.model.use_remove_padding)
    checkpointing = (bool(critic.model.enable_gradient_checkpointing), f"{name}.model.enable_gradient_checkpointing")
    passes = [("log_prob", "forward")] + ([] if frozen else [("update", "ppo")])
    peaks = []
    for pass_name, prefix in passes:
        settings = ("use_dynamic_bsz", f"{prefix}_max_token_len_per_gpu", f"{prefix}_micro_batch_size_per_gpu")
        key, budget, rows = micro_batch(critic, name, *settings, ranks)
        activations = activation_bytes_per_token(shape, element, packed, pass_name, checkpointing[0], longest)
        peaks.append(logits_peak(pass_name, key, budget, packed, 1, element, False, False, longest, activations,
                                 checkpointing, rows))  # fmt: skip
    return peaks


def _resident_parts(level: LevelMemory, phase: str, scale: list[str]) -> list[Part]:
    """The level's state on the device between passes, each part with the offload key that frees it in ``phase``:
    ``param_offload`` / ``optimizer_offload`` in generation; in a log-prob pass (eval mode loads the parameters back)
    ``optimizer_offload`` for the moments; in an update (train mode loads both back) only ``offload_policy``."""
    name = level.level.upper() if level.level != "snapshot" else "lagged snapshot"
    frees = {
        "generation": ("param_offload", "optimizer_offload"),
        "log_prob": ("offload_policy", "optimizer_offload"),
        "update": ("offload_policy", "offload_policy"),
    }[phase]

    def keys(unset: dict[str, str], key: str) -> list[str]:
        return [unset[key]] if key in unset else []

    parts = [
        Part(f"{name} actor parameters", level.actor_resident_parameters, 0.0,
             keys(level.unset_offload, frees[0]) + scale),
        Part(f"{name} AdamW moments", level.actor_resident_optimizer, 0.0,
             keys(level.unset_offload, frees[1]) + scale),
    ]  # fmt: skip
    if level.critic_tree:
        critic_keys = sorted({*keys(level.critic_unset_offload, frees[0]), *keys(level.critic_unset_offload, frees[1])})
        parts.append(Part(f"{name} critic ({level.critic_tree})", level.critic_resident, 0.0, critic_keys + scale))
    return parts


def _vllm_part(level: LevelMemory) -> Part:
    name = level.level.upper() if level.level != "snapshot" else "lagged snapshot"
    if level.vllm_fraction is None:
        key = f"lower {level.tree}.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
        return Part(f"{name} vLLM (weights + KV cache)", level.vllm_budget or 0, 0.0, [key])
    key = f"{level.tree}.rollout.gpu_memory_utilization"
    return Part(f"{name} vLLM ({key}={level.vllm_fraction:g})", 0, level.vllm_fraction, [f"lower {key}"])


def _pass_parts(level: LevelMemory, peak: LogitsPeak, scale: list[str]) -> list[Part]:
    """What a pass adds to the resident parts: the actor state it loads back (and, in the update, gradients and
    AdamW moments), and the logits and activations of its largest micro-batch."""
    name = level.level.upper()
    logits = Part(f"{name} logits of {_batch(peak)}", peak.bytes, 0.0, _batch_keys(peak))
    activations = _activations_part(name, peak)
    if peak.pass_name == "log_prob":
        loaded = level.actor_parameters - level.actor_resident_parameters  # param_offload: loaded for the pass
        return [Part(f"{name} actor parameters loaded for the pass", loaded, 0.0, scale), logits, activations]
    state = (level.actor_parameters + level.actor_gradients + level.actor_optimizer
             - level.actor_resident_parameters - level.actor_resident_optimizer)  # fmt: skip
    keys = [level.unset_offload[k] for k in ("offload_policy",) if k in level.unset_offload] + scale
    return [Part(f"{name} gradients (and offloaded state loaded) for the update", state, 0.0, keys), logits,
            activations]  # fmt: skip


def _critic_pass_parts(level: LevelMemory, peak: LogitsPeak, scale: list[str]) -> list[Part]:
    """What a critic's values pass (its parameters loaded back) or update (its gradients, and its offloaded state
    loaded back) adds to the resident parts, and the activations and values of its largest micro-batch."""
    name = f"{level.level.upper()} critic"
    if peak.pass_name == "log_prob":
        state = Part(f"{name} parameters loaded for its values pass", level.critic_loaded, 0.0, scale)
    else:
        state = Part(f"{name} gradients (and offloaded state loaded) for its update",
                     level.critic - level.critic_resident, 0.0, scale)  # fmt: skip
    return [state, _activations_part(name, peak, values=True)]


def _batch(peak: LogitsPeak) -> str:
    return f"a {peak.tokens:,}-token {peak.layout} micro-batch ({peak.pass_name})"


def _batch_keys(peak: LogitsPeak) -> list[str]:
    """What makes a pass's micro-batch smaller: its token budget, down to the longest row; packed sequences."""
    keys = [f"lower {peak.key} (not below {peak.least})"] if peak.budget > peak.least else []
    if peak.layout == "padded":
        keys.append("install flash-attn (packed sequences: docs/GPU_RUN.md)")
    return keys


def _activations_part(name: str, peak: LogitsPeak, values: bool = False) -> Part:
    """The activations of a pass's largest micro-batch (``values``: and a critic's values, its "logits")."""
    unchecked = peak.pass_name == "update" and not peak.checkpointing
    how = "" if peak.pass_name == "log_prob" else ", gradient checkpointing " + ("off" if unchecked else "on")
    what = "activations and values" if values else "activations"
    return Part(f"{name} {what} of {_batch(peak)}{how}", peak.activations + (peak.bytes if values else 0), 0.0,
                ([f"{peak.checkpointing_key}=true"] if unchecked else []) + _batch_keys(peak))  # fmt: skip


def _label(level: LevelMemory) -> str:
    return level.level.upper() if level.level != "snapshot" else "lagged snapshot"


def _bucket_part(level: LevelMemory) -> Part:
    return Part(f"{_label(level)} weight-transfer bucket ({level.bucket_key}={level.bucket >> 20})", level.bucket, 0.0,
                [f"lower {level.bucket_key} (not below the largest tensor's MiB)"])  # fmt: skip


def device_overheads(levels: list[LevelMemory], ranks: int) -> list[Part]:
    """What the processes on one device hold besides the model state: a CUDA context each (:data:`CUDA_CONTEXT`) and
    NCCL's buffers in each process of a communicator of more than one rank (:data:`NCCL_BUFFERS`).

    The processes on a device of ``ranks`` (the pool's devices): one worker process holding every role of the pool's
    levels (the project fuses each level's actor, reference and critic, and under colocated placement both levels,
    with verl's ``create_colocated_worker_cls``, one process per device: ``max_colocate_count=1``), whose FSDP
    collectives use NCCL when ``ranks`` > 1; and one vLLM worker per level (verl starts vLLM with the ``mp`` executor:
    a worker process per device of a replica), in an NCCL group when its replica has tensor parallelism."""
    worker = f"{' + '.join(_label(level) for level in levels)} worker"
    processes = [worker] + [f"{_label(level)} vLLM worker" for level in levels]
    nccl = ([worker] if ranks > 1 else []) + [f"{_label(lv)} vLLM worker" for lv in levels if lv.tensor_parallel > 1]
    parts = [Part(f"CUDA contexts ({len(processes)} process(es) × {gib(CUDA_CONTEXT)} GiB: {', '.join(processes)})",
                  len(processes) * CUDA_CONTEXT, 0.0, [])]  # fmt: skip
    if nccl:
        parts.append(Part(f"NCCL buffers ({len(nccl)} process(es) × {gib(NCCL_BUFFERS)} GiB: {', '.join(nccl)})",
                          len(nccl) * NCCL_BUFFERS, 0.0, []))  # fmt: skip
    return parts


def _phase(name: str, parts: list[Part], device: int | None, logits: LogitsPeak | None = None) -> Phase:
    parts = [part for part in parts if part.bytes or part.fraction]
    fixed = sum(part.bytes for part in parts)
    fraction = sum(part.fraction for part in parts)
    total = None if device is None else fixed + sum(int(part.fraction * device) for part in parts)
    return Phase(name, parts, fixed, fraction, total, logits)


def device_sum(levels: list[LevelMemory], devices: str, device: int | None, scale: list[str], ranks: int) -> DeviceSum:
    """The phases of a step on devices that hold ``levels`` (module docstring) and the largest of them; ``ranks``:
    the devices of the pool (:func:`device_overheads`).

    Every phase holds the processes' overheads. Generation: every level's resident state, its vLLM engine (all awake
    at once) and its weight-transfer bucket (the push that precedes generation fills it on the actor's device while
    vLLM holds its weights, and the actor's caching allocator keeps the block). A level's log-prob or update pass:
    the resident state, what the pass adds (:func:`_pass_parts`), and the vLLM engines that do not sleep. A critic's
    values pass and update (:func:`_critic_pass_parts`): the state the pass loads back (and its gradients) and the
    activations of its largest micro-batch (no logits: one value a token)."""
    overheads = device_overheads(levels, ranks)

    def resident(phase: str) -> list[Part]:
        return overheads + [part for level in levels for part in _resident_parts(level, phase, scale)]

    awake = [_vllm_part(level) for level in levels if not level.vllm_sleeps]
    engines = [_vllm_part(level) for level in levels] + [_bucket_part(level) for level in levels]
    generation = resident("generation") + engines
    phases = [_phase("generation", generation, device)]
    for level in levels:
        for peak in level.logits:
            name = f"{level.level.upper()} {'update' if peak.pass_name == 'update' else 'log-prob pass'}"
            parts = resident(peak.pass_name) + _pass_parts(level, peak, scale) + awake
            phases.append(_phase(name, parts, device, peak))
        for peak in level.critic_passes:
            name = f"{level.level.upper()} critic {'update' if peak.pass_name == 'update' else 'values pass'}"
            phases.append(_phase(name, resident(peak.pass_name) + _critic_pass_parts(level, peak, scale) + awake,
                                 device))  # fmt: skip
    if device is None:
        peak = max(phases, key=lambda p: (p.smallest_device is None, p.smallest_device or 0))
    else:
        peak = max(phases, key=lambda p: p.total)
    needed = [p.smallest_device for p in phases]
    return DeviceSum(
        devices=devices,
        levels=[level.level for level in levels],
        phases=phases,
        peak=peak.name,
        fixed=peak.fixed,
        fraction=peak.fraction,
        total=peak.total,
        fits=None if peak.total is None else peak.total <= usable(device),
        smallest_device=None if None in needed else max(needed),
        scale_keys=scale,
        overheads=overheads,
    )


def usable(device: int | None) -> int | None:
    """The memory of a device the sums must stay within: the device less :data:`MARGIN`."""
    return None if device is None else int(device * (1 - MARGIN))


PLAN_DEVICE_KEY = "mlmt.plan_device_gib"


def device_memory_setting(config: DictConfig) -> int | None:
    """``mlmt.plan_device_gib`` in bytes (None when unset).

    Raises:
        ConfigError: Not a number of GiB above 0; names the key.
    """
    value = config.mlmt.get("plan_device_gib")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{PLAN_DEVICE_KEY}={value!r}: give the memory of one device in GiB, a number above 0 (e.g. 80 for an "
            "H100 80GB), or null to use the GPU's reported total"
        )
    return int(value * GIB)


def device_memory(config: DictConfig) -> tuple[int | None, str]:
    """The memory of one device and where it comes from: ``mlmt.plan_device_gib`` when set, else the memory of the
    GPU ``mlmt.plan_device`` names (:data:`~agent_system.launcher.devices.PLAN_DEVICES`), else GPU 0's reported total
    on a GPU, else unknown (the CPU backend)."""
    from agent_system import verl_plugin
    from agent_system.launcher.devices import PLAN_DEVICE_NAME_KEY, planned_device

    setting = device_memory_setting(config)
    if setting is not None:
        return setting, f"{PLAN_DEVICE_KEY}={config.mlmt.plan_device_gib}"
    planned = planned_device(config)
    if planned is not None:
        return int(planned.gib * GIB), f"{PLAN_DEVICE_NAME_KEY}={planned.name}: {planned.model}"
    if verl_plugin.CPU_BACKEND_ACTIVE:
        return None, (
            f"not known here (no GPU; set {PLAN_DEVICE_NAME_KEY}=<name> or {PLAN_DEVICE_KEY}=<GiB> with "
            "mlmt.plan_only=true to plan for a device)"
        )
    import torch

    properties = torch.cuda.get_device_properties(0)
    return int(properties.total_memory), f"GPU 0 ({properties.name}) reports it"


def memory_plan(config: DictConfig, device: int | None, device_source: str, reference: dict[str, bool]) -> MemoryPlan:
    """Each level's :class:`LevelMemory` and the per-device sums of the run's placement (module docstring).

    ``reference``: per level, whether its workers hold a reference model of their own (``config.reference_needed``
    except the levels whose reference is the actor with its LoRA adapter off, ``config.reference_in_actor``).

    Raises:
        MemoryUnavailable: A model folder has no ``config.json``.
    """

    names = ("ll", "hl") if has_hl(config) else ("ll",)
    critics, frozen = critic_levels(config), frozen_levels(config)
    levels = {
        level: level_memory(config, level, device, reference[level], level in critics, frozen[level]) for level in names
    }
    reward = config.mlmt.reward
    if has_hl(config) and reward.hl_reward == "contrastive" and reward.contrastive_reference == "lagged_snapshot":
        levels["snapshot"] = level_memory(config, "snapshot", device, False, False, frozen=True)
    policies = [levels[name] for name in names]
    if config.mlmt.placement == "colocated":
        count = level_ranks(config, "ll")
        scale = ["raise trainer.n_gpus_per_node (the state is sharded over the devices)", "mlmt.placement=split"]
        devices = f"each of the {count} shared devices (mlmt.placement=colocated)"
        sums = [device_sum(policies, devices, device, scale, count)]
    else:
        sums = [
            device_sum(
                [level],
                f"each of the {level.ranks} {name.upper()} devices (mlmt.{name}_gpus)",
                device,
                [f"raise mlmt.{name}_gpus (the state is sharded over the level's devices)"],
                level.ranks,
            )
            for name, level in zip(names, policies, strict=True)
        ]
    if "snapshot" in levels:
        count = levels["snapshot"].ranks
        sums.append(device_sum([levels["snapshot"]], f"each of the {count} lagged-snapshot devices", device,
                               ["raise mlmt.ll_gpus (the snapshot has as many devices as the LL)"], count))  # fmt: skip
    plan = MemoryPlan(device=device, device_source=device_source, usable=usable(device), levels=levels, sums=sums)
    plan.notices = memory_notices(plan)
    return plan


def padded_budgets(plan: MemoryPlan) -> dict[str, int]:
    """The token budgets (rows per micro-batch without dynamic batching) to lower so that each padded pass (sdpa,
    ``use_remove_padding=false``) fits the usable memory (the device less :data:`MARGIN`): ``{key: budget}``. A pass
    whose phase exceeds it gets the largest budget whose logits and activations fit beside the rest of the phase,
    never above its setting; one that would need less than the longest row (one row: the least verl accepts) is left
    as it is, and start-up refuses the run with the numbers
    (:func:`refuse_overcommit`)."""
    lowered: dict[str, int] = {}
    if plan.usable is None:
        return lowered
    for group in plan.sums:
        for phase in group.phases:
            peak = phase.logits
            if peak is None or peak.layout != "padded" or phase.total <= plan.usable:
                continue
            budget = _padded_budget(phase, plan.usable)
            if peak.least <= budget < peak.budget:
                lowered[peak.key] = min(budget, lowered.get(peak.key, budget))
    return lowered


def _padded_budget(phase: Phase, room: int) -> int:
    """The largest token budget of ``phase``'s padded pass whose logits and activations fit in ``room`` bytes beside
    the rest of the phase."""
    peak = phase.logits
    left = room - (phase.total - peak.bytes - peak.activations)
    return max(left, 0) // (peak.tokens_per_unit * (peak.per_token + peak.activations_per_token))


ALLOW_KEY = "mlmt.plan_allow_overcommit"


def overcommit_messages(plan: MemoryPlan) -> list[str]:
    """For each group of devices whose peak exceeds the usable memory (the device less :data:`MARGIN`): the devices,
    the sum and its phase, its three largest parts with what lowers each, what the phase needs at the least token
    budget verl accepts when its sequences are padded, and the keys that give the level(s) more devices (none already
    set)."""
    messages = []
    for group in plan.sums:
        if group.fits is not False:
            continue
        phase = next(phase for phase in group.phases if phase.name == group.peak)
        largest = sorted(phase.parts, key=lambda part: -part.size(plan.device))[:3]
        parts = "; ".join(
            f"{part.what} {gib(part.size(plan.device))} GiB"
            + (f" ({', '.join(k for k in part.keys if k not in group.scale_keys)})"
               if any(k not in group.scale_keys for k in part.keys) else "")
            for part in largest
        )  # fmt: skip
        messages.append(
            f"GPU memory: {' + '.join(name.upper() for name in group.levels)} "
            f"{'needs' if len(group.levels) == 1 else 'need'} about {gib(group.total)} GiB on "
            f"{group.devices} at the peak ({group.peak}), of {gib(plan.usable)} GiB usable ({gib(plan.device)} GiB, "
            f"{plan.device_source}, less a {MARGIN * 100:g} % margin for vLLM's activation profile and "
            f"fragmentation).{_padded_text(phase, plan.usable)} Largest parts: {parts}. Or: "
            f"{'; '.join(group.scale_keys)}"
        )
    return messages


def _padded_text(phase: Phase, room: int) -> str:
    """For a padded pass: the budget a GPU start-up lowers it to, or what the pass needs at the least budget."""
    peak = phase.logits
    if peak is None or peak.layout != "padded":
        return ""
    budget = _padded_budget(phase, room)
    if peak.least <= budget < peak.budget:
        return f" Padded sequences: a start-up on a GPU lowers {peak.key} to {budget}, the largest budget that fits."
    least = phase.total - peak.bytes - peak.activations + peak.at_budget(peak.least)
    floor = "one row" if peak.rows else "the longest row"
    return (f" Padded sequences: at the least budget verl accepts ({peak.key}={peak.least}, {floor}) "
            f"the {phase.name} still needs {gib(least)} GiB.")  # fmt: skip


def memory_notices(plan: MemoryPlan) -> list[str]:
    """Warnings: a peak above the device (:func:`overcommit_messages`; start-up refuses it unless
    ``mlmt.plan_allow_overcommit``), a vLLM budget without room for one sequence of ``max_model_len``."""
    notices = overcommit_messages(plan)
    for level in plan.levels.values():
        if level.kv_sequences is not None and level.kv_sequences < 1:
            notices.append(
                f"GPU memory: {level.level.upper()}'s vLLM budget ({gib(level.vllm_budget)} GiB per device, weights "
                f"{gib(level.vllm_weights)} GiB) leaves KV cache for {level.kv_tokens} tokens, less than one sequence "
                f"of max_model_len={level.max_model_len}: vLLM will refuse to start. Raise its "
                "rollout.gpu_memory_utilization (or engine_kwargs.vllm.kv_cache_memory_bytes)"
            )
    return notices


def refuse_overcommit(plan: MemoryPlan, allowed: bool) -> None:
    """Stop a run whose estimated peak exceeds a device, unless ``mlmt.plan_allow_overcommit`` (``allowed``).

    Raises:
        ConfigError: :func:`overcommit_messages`, and the key that starts the run anyway.
    """
    messages = overcommit_messages(plan)
    if messages and not allowed:
        raise ConfigError(
            " | ".join(messages) + f". The run would fail at its first wake-up or update; set {ALLOW_KEY}=true to "
            "start it anyway"
        )


def gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.2f}"


def _activations_text(peaks: list[LogitsPeak], forward: str = "log-prob") -> str:
    """The activations of each pass's largest micro-batch, for the plan; ``forward`` names the pass without autograd
    (a critic's is its values pass)."""
    return "; ".join(
        f"{forward if peak.pass_name == 'log_prob' else 'update'} "
        f"{gib(peak.activations)} GiB ({peak.key}={peak.budget}: {peak.tokens:,} tokens × "
        f"{peak.activations_per_token:,} bytes"
        + ("" if peak.pass_name == "log_prob" else f", {peak.checkpointing_key}={str(peak.checkpointing).lower()}")
        + ")"
        for peak in peaks
    )


def render_memory(plan: MemoryPlan) -> list[str]:
    """The plan's Markdown lines of the estimate."""
    device = (
        f"{gib(plan.device)} GiB ({plan.device_source}); usable {gib(plan.usable)} GiB (a {MARGIN * 100:g} % "
        "margin kept free)"
        if plan.device is not None
        else f"{plan.device_source}; the sums must stay within {(1 - MARGIN) * 100:g} % of it"
    )
    lines = [f"## GPU memory per device (estimate from config.json; {EXCLUDED})", f"- device: {device}"]
    for level in plan.levels.values():
        name = "lagged snapshot (LL model, never updated)" if level.level == "snapshot" else level.level.upper()
        state = (
            f"parameters {gib(level.actor_parameters)}"
            + ("" if level.frozen else f", gradients {gib(level.actor_gradients)}, AdamW {gib(level.actor_optimizer)}")
            + (" — frozen: parameters only" if level.frozen and level.level != "snapshot" else "")
            + ("" if level.frozen else f" GiB in its update; between passes parameters "
               f"{gib(level.actor_resident_parameters)}, AdamW {gib(level.actor_resident_optimizer)}")
        )  # fmt: skip
        offload = ", ".join(level.offload)
        host = f"; on the host per rank: {gib(level.actor_host + level.critic_host)} GiB ({offload})" if offload else ""
        reference = (
            f"on the host, {gib(level.reference_host)} GiB per rank (verl offloads it)"
            if level.reference_host
            else "no copy (a KL reference is the actor with its LoRA adapter off)"
            if level.lora
            else "none"
        )
        critic = (
            f"{gib(level.critic)} GiB in its update ({level.critic_parameters / 1e9:.2f}B parameters, trained like "
            f"the actor)"
            if level.critic_parameters
            else "none"
        )
        if level.vllm_fraction is None:
            budget = f"{gib(level.vllm_budget)} GiB (weights + engine_kwargs.vllm.kv_cache_memory_bytes)"
        else:
            budget = f"{level.vllm_fraction:g} × device = {gib(level.vllm_budget)} GiB"
        capacity = (
            "KV capacity not known here (it depends on the device size)"
            if level.kv_sequences is None
            else f"KV cache {gib(level.kv_cache)} GiB = {level.kv_tokens:,} tokens = {level.kv_sequences} sequences "
            f"of max_model_len={level.max_model_len} per replica"
        )
        lora = (
            f"; {level.lora}: gradients and AdamW for its {level.trained_parameters:,} adapter parameters only"
            if level.lora
            else ""
        )
        logits = "; ".join(
            f"{peak.pass_name.replace('_', '-')} {gib(peak.bytes)} GiB ({peak.key}={peak.budget}: {peak.tokens:,} "
            f"{peak.layout} tokens × {peak.per_token:,} bytes)"
            for peak in level.logits
        )
        activations = _activations_text(level.logits)
        critic_activations = _activations_text(level.critic_passes, "values")
        sleeps = "asleep outside generation" if level.vllm_sleeps else "awake in every phase"
        lines += [
            f"- {name}: {level.parameters / 1e9:.2f}B parameters, FSDP over {level.shards} of {level.ranks} rank(s), "
            f"{level.actor_dtype}{lora}",
            f"  - actor: {state} GiB{host}",
            f"  - reference: {reference}; critic: {critic}",
            *([f"  - logits peak of the largest micro-batch: {logits}"] if logits else []),
            *([f"  - activations of the largest micro-batch: {activations}"] if activations else []),
            *(
                [f"  - critic activations of the largest micro-batch: {critic_activations}"]
                if critic_activations
                else []
            ),
            f"  - weight-transfer bucket: {gib(level.bucket)} GiB on the actor's device in generation "
            f"({level.bucket_key}={level.bucket >> 20})",
            f"  - vLLM ({sleeps}): {budget}; weights {gib(level.vllm_weights)} GiB; {capacity} "
            f"({level.kv_bytes_per_token:,} bytes of KV per token)",
        ]
    for group in plan.sums:
        names = " + ".join(name.upper() if name != "snapshot" else "snapshot" for name in group.levels)
        if group.total is None:
            shares = f" + {group.fraction:g} × device" if group.fraction else ""
            smallest = (
                f"; fits a device of at least {gib(group.smallest_device)} GiB"
                if group.smallest_device is not None
                else "; vLLM's shares alone fill the device"
            )
            lines.append(
                f"- peak on {group.devices} ({group.peak}): {names} = {gib(group.fixed)} GiB{shares}{smallest}"
            )
        else:
            verdict = "fits" if group.fits else "DOES NOT FIT"
            phases = ", ".join(f"{phase.name} {gib(phase.total)}" for phase in group.phases)
            lines.append(
                f"- peak on {group.devices} ({group.peak}): {names} = {gib(group.total)} of {gib(plan.usable)} GiB "
                f"usable — {verdict} (phases: {phases} GiB)"
            )
        lines += [f"  - in every phase: {part.what} = {gib(part.bytes)} GiB" for part in group.overheads]
    return lines
