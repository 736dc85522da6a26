"""The per-device GPU memory estimate (agent_system/launcher/memory_estimate.py) against hand computation for
Llama-3.2-1B and -3B shapes, written here from their public config.json values (nothing is downloaded), and its
activation count against the tensors autograd keeps for a small Qwen2 model built by transformers."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from config_copies import copier
from omegaconf import OmegaConf

from agent_system.config import ConfigError, compose_config, level_view
from agent_system.launcher.gpu_checks import attention_fallback, lower_padded_budgets
from agent_system.launcher.memory_estimate import (
    ALLOW_KEY,
    CUDA_CONTEXT,
    GIB,
    MARGIN,
    NCCL_BUFFERS,
    MemoryUnavailable,
    ModelShape,
    activation_bytes_per_token,
    device_memory,
    device_memory_setting,
    logits_peak,
    memory_plan,
    overcommit_messages,
    padded_budgets,
    refuse_overcommit,
    render_memory,
)

LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
LLAMA_3B = {"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "intermediate_size": 8192,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
            "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
P1B = 1_235_814_400  # 128256·2048 + 16 · (2·2048² + 2·2048·512 + 3·2048·8192 + 2·2048) + 2048
P3B = 3_212_749_824  # 128256·3072 + 28 · (2·3072² + 2·3072·1024 + 3·3072·8192 + 2·3072) + 3072
D80 = 80 * 2**30  # 85_899_345_920 bytes
GPU_LIKE = [  # the CPU overlay's settings replaced by verl's GPU ones (bf16 vLLM sized by gpu_memory_utilization and
    # asleep outside generation, packed sequences with flash-attn, bf16 compute, 16k-token micro-batches; the
    # critics' too)
    f"{tree}.{key}"
    for tree in ("actor_rollout_ref", "hl")
    for key in ("rollout.dtype=bfloat16", "rollout.engine_kwargs.vllm.kv_cache_memory_bytes=null",
                "rollout.free_cache_engine=true", "model.use_remove_padding=true",
                "actor.ppo_max_token_len_per_gpu=16384",
                "rollout.log_prob_max_token_len_per_gpu=16384", "actor.entropy_coeff=0.001",
                "model.enable_gradient_checkpointing=true")
] + [f"++{tree}.actor.fsdp_config.mixed_precision.param_dtype=bf16" for tree in ("actor_rollout_ref", "hl")] + [
    f"{tree}.{key}"
    for tree in ("critic", "hl_critic")
    for key in ("ppo_max_token_len_per_gpu=16384", "model.use_remove_padding=true",
                "model.enable_gradient_checkpointing=true")
] + [f"++{tree}.fsdp.mixed_precision.param_dtype=bf16" for tree in ("critic", "hl_critic")] + [
    "data.max_prompt_length=1024", "data.max_response_length=4096", "hl.rollout.response_length=4096"]  # fmt: skip
VOCAB = 128256
# the logits peak of a 16,384-token packed micro-batch (docs/RUN_PLAN.md): the update keeps the bf16 logits, their
# temperature-scaled copy and their gradient (3 × 2 bytes) and the chunked entropy's fp32 copy and softmax (8 bytes);
# a log-prob pass the two bf16 copies and one transient fp32 entropy chunk of 2,048 rows (12 bytes each)
UPDATE_LOGITS = 16384 * VOCAB * (3 * 2 + 8)  # 27.40 GiB
LOG_PROB_LOGITS = 16384 * VOCAB * 2 * 2 + 2048 * VOCAB * 12
# activations per token (bf16, packed): one Llama-3.2-1B layer's saved tensors (two RMSNorms' fp32 input, fp32
# reciprocal root and bf16 output; query and output of 2,048, keys and values of 512, the fp32 log-sum-exp of 32
# heads; four MLP tensors of 8,192); the update with gradient checkpointing adds the 16 layers' input hidden states
# and the final norm's tensors
LAYER_1B = 2 * ((4 + 2 * 2) * 2048 + 4) + 2 * (2 * 2048 + 2 * 512) + 4 * 32 + 4 * 2 * 8192  # 108,680
UPDATE_ACTIVATIONS = 16384 * (16 * 2 * 2048 + LAYER_1B + (4 + 2 * 2) * 2048 + 4)  # 2.91 GiB
LOG_PROB_ACTIVATIONS = 16384 * LAYER_1B
# a device of a level's pool of several ranks: a CUDA context for its worker and its vLLM worker, NCCL's buffers in
# the worker; generation adds verl's weight-transfer bucket (update_weights_bucket_megabytes: 2048)
OVERHEAD = 2 * CUDA_CONTEXT + NCCL_BUFFERS
BUCKET = 2048 * 2**20


def _model(folder, hf_config: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config))
    return str(folder)


@pytest.fixture(scope="module")
def base():
    return copier(compose_config(GPU_LIKE))  # composed once (Hydra is slow on a loaded machine); each test edits a copy


def _config(base, tmp_path, overrides, ll=LLAMA_1B, hl=LLAMA_1B):
    config = base()
    for override in overrides:
        key, value = override.lstrip("+").split("=", 1)
        OmegaConf.update(config, key, yaml.safe_load(value), merge=False, force_add=True)
    OmegaConf.update(config, "actor_rollout_ref.model.path", _model(tmp_path / "ll", ll))
    OmegaConf.update(config, "hl.model.path", _model(tmp_path / "hl", hl))
    return config


def _plan(config, device=D80, ll_ref=False, hl_ref=False):
    return memory_plan(config, device, "test", {"ll": ll_ref, "hl": hl_ref})


def test_parameter_counts_by_hand_and_as_transformers_builds_them():
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig

    one, three = ModelShape.from_hf_config(LLAMA_1B, "1B"), ModelShape.from_hf_config(LLAMA_3B, "3B")
    assert one.parameters == 262_668_288 + 16 * 60_821_504 + 2048 == P1B
    assert three.parameters == 394_002_432 + 28 * 100_669_440 + 3072 == P3B
    assert one.critic_parameters == P1B + 2048 + 1  # verl's value model: a one-label score head with a bias
    untied = ModelShape.from_hf_config({**LLAMA_1B, "tie_word_embeddings": False}, "untied")
    assert untied.parameters == P1B + 128256 * 2048 and untied.critic_parameters == P1B + 2049
    for hf in (LLAMA_1B, LLAMA_3B):
        fields = {k: v for k, v in hf.items() if k != "model_type"}
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(LlamaConfig(**fields))
            value = AutoModelForTokenClassification.from_config(LlamaConfig(**fields, num_labels=1))
        shape = ModelShape.from_hf_config(hf, "x")
        assert sum(p.numel() for p in lm.parameters()) == shape.parameters
        assert sum(p.numel() for p in value.parameters()) == shape.critic_parameters


def test_a_1b_split_run_on_80_gib_devices_by_hand(base, tmp_path):
    config = _config(base, tmp_path, ["mlmt.ll_gpus=4", "mlmt.hl_gpus=4", "trainer.n_gpus_per_node=8"])
    plan = _plan(config, ll_ref=True)
    ll = plan.levels["ll"]
    # fp32 parameters, gradients and AdamW's two moments, sharded over 4 ranks: 4·P/4 each, 8·P/4 for the moments
    assert (ll.actor_parameters, ll.actor_gradients, ll.actor_optimizer) == (P1B, P1B, 2 * P1B)
    assert ll.shards == 4 and ll.actor_host == 0 and ll.critic == 0
    assert ll.reference_host == 4 * P1B // 4  # verl offloads the (fp32) reference to the host
    # vLLM at verl's 0.5 of 80 GiB; bf16 weights 2·P; KV per token 2 (K, V) · 16 layers · 8 heads · 64 · 2 bytes
    assert ll.vllm_budget == 42_949_672_960 and ll.vllm_weights == 2 * P1B == 2_471_628_800
    assert ll.kv_bytes_per_token == 32_768 and ll.max_model_len == 1024 + 4096
    assert ll.kv_tokens == (42_949_672_960 - 2_471_628_800) // 32_768 == 1_235_291
    assert ll.kv_sequences == 1_235_291 // 5120 == 241
    ll_sum, hl_sum = plan.sums
    # the peak is generation: parameters and moments beside vLLM; gradients exist only in the update (verl's
    # zero_grad frees them when it ends), while vLLM sleeps
    phases = {phase.name: phase.total for phase in ll_sum.phases}
    generation = OVERHEAD + 3 * P1B + 42_949_672_960 + BUCKET
    assert phases == {"generation": generation,
                      "LL log-prob pass": OVERHEAD + 3 * P1B + LOG_PROB_LOGITS + LOG_PROB_ACTIVATIONS,
                      "LL update": OVERHEAD + 4 * P1B + UPDATE_LOGITS + UPDATE_ACTIVATIONS}  # fmt: skip
    assert ll_sum.levels == ["ll"] and ll_sum.peak == "generation" and ll_sum.total == generation
    assert ll_sum.fits and hl_sum.levels == ["hl"] and plan.levels["hl"].reference_host == 0 and not plan.notices


def test_a_3b_colocated_run_with_a_critic_fits_eight_80_gib_devices_within_the_margin_but_not_one(base, tmp_path):
    shares = [f"{t}.rollout.gpu_memory_utilization=0.35" for t in ("actor_rollout_ref", "hl")]
    overrides = ["mlmt.placement=colocated", "mlmt.ll.adv_estimator=gae", "trainer.n_gpus_per_node=8", *shares]
    config = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    plan = _plan(config)
    ll, hl = plan.levels["ll"], plan.levels["hl"]
    assert ll.actor_parameters + ll.actor_gradients + ll.actor_optimizer == 16 * P3B // 8 == 6_425_499_648
    assert ll.critic == 4 * -(-4 * (P3B + 3073) // 8) == 6_425_505_796 and hl.critic == 0  # shards rounded up
    assert ll.vllm_budget == int(0.35 * D80) == 30_064_771_072
    assert ll.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688
    assert ll.kv_sequences == (30_064_771_072 - 2 * P3B) // 114_688 // 5120 == 40
    (shared,) = plan.sums
    assert shared.levels == ["ll", "hl"] and shared.devices.startswith("each of the 8 shared devices")
    # generation: both actors' parameters and moments (12 bytes a parameter), the critic's, both vLLM shares, both
    # weight-transfer buckets; CUDA contexts of the one worker process (both levels' actors and the critic) and the
    # two vLLM workers, NCCL's buffers in the worker
    overheads = 3 * CUDA_CONTEXT + NCCL_BUFFERS + 2 * BUCKET
    assert shared.peak == "generation"
    assert shared.total == 2 * 12 * P3B // 8 + 3 * 1_606_376_449 + 2 * 30_064_771_072 + overheads
    assert (1 - MARGIN) * D80 < shared.total < D80 and not shared.fits  # 75.96 GiB: beyond the 10 % margin
    smaller = [f"{t}.rollout.gpu_memory_utilization=0.3" for t in ("actor_rollout_ref", "hl")]
    fits = _plan(_config(base, tmp_path, [*overrides[:3], *smaller], LLAMA_3B, LLAMA_3B))
    assert fits.sums[0].total == shared.total - 2 * (30_064_771_072 - int(0.3 * D80)) <= 72 * GIB  # 67.96 GiB
    assert fits.sums[0].fits and not fits.notices

    one = _plan(_config(base, tmp_path, [*overrides[:2], "trainer.n_gpus_per_node=1", *shares], LLAMA_3B, LLAMA_3B))
    one_overheads = 3 * CUDA_CONTEXT + 2 * BUCKET  # one rank: no NCCL
    assert one.sums[0].total == 12 * P3B * 2 + 12 * (P3B + 3073) + 2 * 30_064_771_072 + one_overheads
    assert not one.sums[0].fits and len(one.notices) == 1
    assert one.notices[0].startswith("GPU memory: LL + HL need about 169.22 GiB")


def test_offload_and_fsdp_size_move_and_reshard_the_actor_state(base, tmp_path):
    shared = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=8"]
    fsdp = "actor_rollout_ref.actor.fsdp_config"
    param = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.param_offload=true"])).levels["ll"]
    # verl's train mode loads the parameters back for the update and creates the gradients there; they are freed
    # (zero_grad) before the parameters go back to the host: the host holds parameters only
    assert (param.actor_parameters, param.actor_gradients, param.actor_optimizer) == (P1B // 2, P1B // 2, P1B)
    assert (param.actor_resident_parameters, param.actor_resident_optimizer) == (0, P1B)
    assert param.actor_host == 4 * P1B // 8 and param.offload == [f"{fsdp}.param_offload=true"]
    optim = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.optimizer_offload=true"])).levels["ll"]
    assert (optim.actor_optimizer, optim.actor_resident_optimizer, optim.actor_host) == (P1B, 0, P1B)
    policy = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.offload_policy=true"])).levels["ll"]
    assert policy.actor_parameters + policy.actor_gradients + policy.actor_optimizer == 0  # the step runs on the host
    assert policy.actor_resident_parameters + policy.actor_resident_optimizer == 0
    assert policy.actor_host == 12 * P1B // 8
    hsdp = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.fsdp_size=2"])).levels["ll"]
    assert hsdp.shards == 2 and hsdp.actor_parameters == 4 * P1B // 2  # each HSDP group holds a whole copy
    bf16 = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.model_dtype=bf16"])).levels["ll"]
    assert bf16.actor_parameters + bf16.actor_gradients + bf16.actor_optimizer == 8 * P1B // 8


def test_frozen_levels_and_the_lagged_snapshot_hold_parameters_only(base, tmp_path):
    overrides = ["mlmt.hl.freeze=true", "mlmt.reward.hl_reward=r3", "mlmt.ll_gpus=2", "mlmt.hl_gpus=2",
                 "trainer.n_gpus_per_node=4"]  # fmt: skip
    plan = _plan(_config(base, tmp_path, overrides))
    hl = plan.levels["hl"]
    assert hl.frozen and (hl.actor_parameters, hl.actor_gradients, hl.actor_optimizer) == (2 * P1B, 0, 0)
    snapshot = ["mlmt.reward.hl_reward=contrastive", "mlmt.reward.contrastive_reference=lagged_snapshot"]
    plan = _plan(_config(base, tmp_path, [*overrides[2:], *snapshot]))
    lagged = plan.levels["snapshot"]
    assert (lagged.actor_parameters, lagged.actor_optimizer, lagged.ranks) == (2 * P1B, 0, 2)
    assert [group.levels for group in plan.sums] == [["ll"], ["hl"], ["snapshot"]]


def test_tensor_parallel_kv_dtype_and_a_fixed_kv_cache(base, tmp_path):
    vllm = "actor_rollout_ref.rollout"
    tp = _plan(_config(base, tmp_path, [f"{vllm}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2",
                                  "mlmt.ll_gpus=2"])).levels["ll"]  # fmt: skip
    assert tp.vllm_weights == 2 * P1B // 2 and tp.kv_bytes_per_token == 32_768 // 2  # 4 of the 8 kv heads each
    auto = _plan(_config(base, tmp_path, [f"{vllm}.dtype=auto"])).levels["ll"]  # vLLM's choice: 16-bit
    assert auto.vllm_weights == 2 * P1B and auto.kv_bytes_per_token == 32_768
    fp8 = _plan(_config(base, tmp_path, [f"+{vllm}.engine_kwargs.vllm.kv_cache_dtype=fp8"])).levels["ll"]
    assert fp8.kv_bytes_per_token == 16_384
    kv_cache = [f"{vllm}.engine_kwargs.vllm.kv_cache_memory_bytes={2**30}"]
    fixed = _plan(_config(base, tmp_path, kv_cache), None).levels["ll"]
    # vLLM ignores gpu_memory_utilization: weights + the KV cache, known without the device's size
    assert fixed.vllm_fraction is None and fixed.vllm_budget == 2 * P1B + 2**30
    assert fixed.kv_tokens == 2**30 // 32_768 == 32_768 and fixed.kv_sequences == 32_768 // 5120 == 6


def test_without_the_device_size_the_plan_gives_the_smallest_device_that_fits(base, tmp_path):
    plan = _plan(_config(base, tmp_path, ["mlmt.ll_gpus=1", "mlmt.hl_gpus=1"]), device=None)
    ll_sum = plan.sums[0]
    generation, log_prob, update = ll_sum.phases
    contexts = 2 * CUDA_CONTEXT  # one rank: no NCCL buffers
    assert (generation.fixed, generation.fraction) == (12 * P1B + contexts + BUCKET, 0.5)  # + half the device for vLLM
    update_fixed = 16 * P1B + UPDATE_LOGITS + UPDATE_ACTIVATIONS + contexts
    assert (update.fixed, update.fraction) == (update_fixed, 0.0)  # vLLM asleep
    assert ll_sum.total is None and ll_sum.fits is None and ll_sum.peak == "LL update"
    # the smallest device whose usable memory (90 %) holds each phase
    smallest = max(math.ceil(generation.fixed / (0.9 - 0.5)), math.ceil(update_fixed / 0.9))
    assert ll_sum.smallest_device == smallest == math.ceil(update_fixed / 0.9)
    assert plan.levels["ll"].kv_sequences is None
    text = "\n".join(render_memory(plan))
    assert f"(LL update): LL = {update_fixed / GIB:.2f} GiB; fits a device of at least {smallest / GIB:.2f} GiB" in text
    assert "the sums must stay within 90 % of it" in text
    assert "KV capacity not known here" in text


def test_a_vllm_budget_without_room_for_one_sequence_is_a_notice(base, tmp_path):
    plan = _plan(_config(base, tmp_path, ["actor_rollout_ref.rollout.gpu_memory_utilization=0.05"]), device=24 * GIB)
    assert plan.levels["ll"].kv_sequences == 0  # 1.2 GiB of budget, 2.3 GiB of weights
    assert any("vLLM will refuse to start" in notice and "LL's" in notice for notice in plan.notices)


@pytest.mark.parametrize("value", ["abc", 0, -8, True, float("nan")])
def test_a_bad_device_size_is_rejected_by_name(base, value):
    config = base()
    config.mlmt.plan_device_gib = value
    with pytest.raises(ConfigError, match=r"mlmt.plan_device_gib=.*a number above 0"):
        device_memory_setting(config)


def test_the_device_size_on_cpu_is_the_setting_or_not_known(base):
    size, source = device_memory(base())
    assert size is None and "not known here" in source and "mlmt.plan_device_gib" in source
    config = compose_config(["mlmt.plan_device_gib=79.5"])  # the key as the command line gives it
    assert device_memory(config) == (int(79.5 * GIB), "mlmt.plan_device_gib=79.5")


def test_a_model_folder_without_config_json_makes_the_estimate_unavailable(base, tmp_path):
    config = base()
    config.actor_rollout_ref.model.path = str(tmp_path)
    with pytest.raises(MemoryUnavailable, match=f"actor_rollout_ref.model.path={tmp_path}: no config.json"):
        memory_plan(config, None, "", {"ll": False, "hl": False})


QWEN_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
           "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "tie_word_embeddings": False}  # fmt: skip  # Qwen2.5-7B-Instruct's config.json
SPLIT_2_2 = ["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=4"]  # the experiment scripts' default


def test_a_7b_feedback_writer_on_two_80_gib_devices_is_refused_with_the_numbers_and_the_keys(base, tmp_path):
    plan = _plan(_config(base, tmp_path, SPLIT_2_2, hl=QWEN_7B))
    hl = plan.sums[1]
    p7b = ModelShape.from_hf_config(QWEN_7B, "7B").parameters
    logits = 16384 * 152064 * (3 * 2 + 8)  # the update's packed micro-batch over Qwen's vocabulary: 32.48 GiB
    phases = {phase.name: phase.total for phase in hl.phases}
    # its layer: norms 2 × (8 × 3,584 + 4), query and output 2 × 2 × 3,584, keys and values 2 × 2 × 512, the
    # log-sum-exp 4 × 28, MLP 8 × 18,944
    layer = 2 * (8 * 3584 + 4) + 2 * 2 * 3584 + 2 * 2 * 512 + 4 * 28 + 8 * 18944
    activations = 16384 * (28 * 2 * 3584 + layer + 8 * 3584 + 4)  # checkpointed: 6.94 GiB
    # generation: fp32 parameters and AdamW moments (12 bytes a parameter over 2 ranks) beside vLLM's 0.5 × 80 GiB;
    # the update: with the gradients (16 bytes a parameter), the logits and activations, vLLM asleep. Both exceed
    # 80 GiB, let alone the 72 GiB usable.
    assert phases["generation"] == OVERHEAD + 12 * p7b // 2 + D80 // 2 + BUCKET > D80
    assert phases["HL update"] == OVERHEAD + 16 * p7b // 2 + logits + activations > D80
    assert hl.peak == "HL update" and hl.total == phases["HL update"] and not hl.fits
    with pytest.raises(ConfigError) as refused:
        refuse_overcommit(plan, allowed=False)
    message = str(refused.value)
    assert f"needs about {hl.total / GIB:.2f} GiB on each of the 2 HL devices (mlmt.hl_gpus)" in message
    assert (
        "of 72.00 GiB usable (80.00 GiB, test, less a 10 % margin" in message and "at the peak (HL update)" in message
    )
    assert (
        f"HL logits of a 16,384-token packed micro-batch (update) {logits / GIB:.2f} GiB (lower "
        "hl.actor.ppo_max_token_len_per_gpu (not below 5120))" in message
    )
    # in the update verl's train mode loads param_offload's and optimizer_offload's state back: only
    # offload_policy keeps the moments off the device
    assert f"HL AdamW moments {8 * p7b / 2 / GIB:.2f} GiB (hl.actor.fsdp_config.offload_policy=true)" in message
    assert "optimizer_offload" not in message and "param_offload" not in message
    assert "raise mlmt.hl_gpus" in message and ALLOW_KEY + "=true" in message
    assert "mlmt.placement=split" not in message  # the run is split already
    refuse_overcommit(plan, allowed=True)  # the opt-in key lets it start

    policy = _plan(_config(base, tmp_path, [*SPLIT_2_2, "hl.actor.fsdp_config.offload_policy=true"], hl=QWEN_7B))
    assert policy.sums[1].fits and not overcommit_messages(policy)  # the state stays on the host throughout


def test_a_colocated_overflow_suggests_split_and_no_offload_already_set(base, tmp_path):
    fsdp = "actor_rollout_ref.actor.fsdp_config"
    shares = [f"{t}.rollout.gpu_memory_utilization=0.35" for t in ("actor_rollout_ref", "hl")]
    overrides = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1", f"{fsdp}.param_offload=true", *shares]
    plan = _plan(_config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B))
    (message,) = overcommit_messages(plan)
    assert "each of the 1 shared devices (mlmt.placement=colocated)" in message
    assert "mlmt.placement=split" in message and "raise trainer.n_gpus_per_node" in message
    assert f"{fsdp}.param_offload=true" not in message  # set already
    assert f"LL AdamW moments {8 * P3B / GIB:.2f} GiB ({fsdp}.optimizer_offload=true)" in message


TINY_QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 97,
              "tie_word_embeddings": True}  # fmt: skip


def _saved_bytes(layers: int, padded: bool, checkpointing: bool) -> int:
    """Bytes of the tensors autograd keeps for the backward of a bf16 Qwen2 decoder (transformers, sdpa) over two
    rows of 24 tokens (the first 4 of each padding when ``padded``), parameters left out."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    fields = {k: v for k, v in TINY_QWEN2.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(**{**fields, "num_hidden_layers": layers, "use_cache": False}, attn_implementation="sdpa")
    ).to(torch.bfloat16)
    if checkpointing:  # as verl's FSDP engine enables it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in params:
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    mask = torch.ones(2, 24, dtype=torch.long)
    mask[:, :4] = 0 if padded else 1
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.model(input_ids=torch.randint(0, 97, (2, 24)), attention_mask=mask)
    return sum(kept.values())


@pytest.mark.parametrize("padded", [False, True], ids=["packed", "padded"])
def test_a_layer_s_activations_are_the_tensors_autograd_keeps(padded):
    """One more decoder layer adds what :meth:`ModelShape.layer_activation_bytes` counts per token, or, under
    gradient checkpointing, its input hidden state alone (bf16 × hidden)."""
    shape = ModelShape.from_hf_config(TINY_QWEN2, "tiny")
    tokens = 2 * 24
    per_layer = (_saved_bytes(2, padded, False) - _saved_bytes(1, padded, False)) / tokens
    assert per_layer == shape.layer_activation_bytes(2, packed=not padded, row=24)  # 2,712 packed, 2,888 padded
    checkpointed = (_saved_bytes(2, padded, True) - _saved_bytes(1, padded, True)) / tokens
    assert checkpointed == 2 * 64


def test_gradient_checkpointing_off_adds_every_layer_s_activations_to_the_update(base, tmp_path):
    overrides = ["mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2"]
    on = _plan(_config(base, tmp_path, overrides)).levels["ll"]
    off_config = _config(base, tmp_path, [*overrides, "actor_rollout_ref.model.enable_gradient_checkpointing=false"])
    off_plan = _plan(off_config)
    off = off_plan.levels["ll"]
    shape = ModelShape.from_hf_config(LLAMA_1B, "1B")
    assert (on.logits[0].activations, off.logits[0].activations) == (LOG_PROB_ACTIVATIONS,) * 2  # no autograd
    assert on.logits[1].activations == UPDATE_ACTIVATIONS
    assert off.logits[1].activations == 16384 * (16 * LAYER_1B + (4 + 2 * 2) * 2048 + 4)  # 26.78 GiB
    assert activation_bytes_per_token(shape, 2, True, "update", False, 5120) == 16 * LAYER_1B + 8 * 2048 + 4
    update = {phase.name: phase.total for phase in off_plan.sums[0].phases}["LL update"]
    assert update == 2 * CUDA_CONTEXT + 16 * P1B + UPDATE_LOGITS + off.logits[1].activations
    (message,) = [text for text in overcommit_messages(off_plan) if text.startswith("GPU memory: LL ")]
    assert (
        "gradient checkpointing off" in message
        and "actor_rollout_ref.model.enable_gradient_checkpointing=true" in message
    )


ONE_DEVICE_CRITIC = ["mlmt.ll.adv_estimator=gae", "mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2"]


def test_a_critic_s_values_pass_and_update_hold_the_activations_of_their_micro_batch(base, tmp_path):
    """A 1B LL critic on one device: its values pass holds one layer's tensors of a 16,384-token micro-batch beside
    the resident state, its update the checkpointed activations, or every layer's without checkpointing; its values
    are one bf16 number a token (2 copies in the values pass, 3 in the update, as the actor's logits)."""
    plan = _plan(_config(base, tmp_path, ONE_DEVICE_CRITIC))
    ll = plan.levels["ll"]
    critic_state = 16 * (P1B + 2049)  # fp32 parameters, gradients and AdamW moments, one shard
    assert ll.critic == critic_state and ll.critic_resident == 12 * (P1B + 2049) and ll.critic_loaded == 0
    values, update = ll.critic_passes
    assert (values.key, values.budget, update.key, update.budget) == (
        "critic.forward_max_token_len_per_gpu", 16384, "critic.ppo_max_token_len_per_gpu", 16384)  # fmt: skip
    assert (values.activations, update.activations) == (LOG_PROB_ACTIVATIONS, UPDATE_ACTIVATIONS)
    phases = {phase.name: phase.total for phase in plan.sums[0].phases}
    resident = 2 * CUDA_CONTEXT + 12 * P1B + 12 * (P1B + 2049)  # one rank: no NCCL; fp32 actor and critic state
    assert phases["LL critic values pass"] == resident + LOG_PROB_ACTIVATIONS + 16384 * 2 * 2
    assert phases["LL critic update"] == resident + 4 * (P1B + 2049) + UPDATE_ACTIVATIONS + 16384 * 3 * 2

    off = _plan(_config(base, tmp_path, [*ONE_DEVICE_CRITIC, "critic.model.enable_gradient_checkpointing=false"]))
    shape = ModelShape.from_hf_config(LLAMA_1B, "1B")
    per_token = activation_bytes_per_token(shape, 2, True, "update", False, 5120)  # 16 layers' sets: 1.66 MiB
    assert off.levels["ll"].critic_passes[1].activations == 16384 * per_token  # 26.78 GiB
    (critic_update,) = [phase for phase in off.sums[0].phases if phase.name == "LL critic update"]
    assert critic_update.total == resident + 4 * (P1B + 2049) + 16384 * per_token + 16384 * 3 * 2
    (activations,) = [part for part in critic_update.parts if "activations" in part.what]
    assert activations.what == ("LL critic activations and values of a 16,384-token packed micro-batch (update), "
                                "gradient checkpointing off")  # fmt: skip
    assert activations.keys == ["critic.model.enable_gradient_checkpointing=true",
                                "lower critic.ppo_max_token_len_per_gpu (not below 5120)"]  # fmt: skip
    text = "\n".join(render_memory(off))
    assert ("critic activations of the largest micro-batch: values 1.66 GiB (critic.forward_max_token_len_per_gpu"
            "=16384: 16,384 tokens × 108,680 bytes); update 26.78 GiB") in text  # fmt: skip


def test_the_logits_peak_scales_with_vocabulary_and_token_budget_as_the_formula_says():
    def peak(budget, vocab, packed=True, pass_name="update", entropy=True):
        return logits_peak(pass_name, "k", budget, packed, vocab, 2, entropy, True, 5120, 0, (True, "k"))

    assert peak(16384, 151_936).bytes == 16384 * 151_936 * (3 * 2 + 8)  # 37.1 GiB for Qwen2.5's vocabulary
    assert peak(8192, 151_936).bytes * 2 == peak(16384, 151_936).bytes
    assert peak(16384, 75_968).bytes * 2 == peak(16384, 151_936).bytes
    assert peak(16384, 151_936, entropy=False).bytes == 16384 * 151_936 * 6  # no entropy term: no fp32 copies
    assert peak(16384, 151_936, pass_name="log_prob").bytes == 16384 * 151_936 * 4 + 2048 * 151_936 * 12
    padded = peak(16384, 151_936, packed=False)  # twice the tokens; unchunked entropy and the real tokens' copies
    assert (padded.tokens, padded.layout) == (32768, "padded")
    assert padded.bytes == 32768 * 151_936 * (5 + 2) * 2


def test_without_flash_attn_the_padded_budgets_are_lowered_to_what_fits_or_refused(base, tmp_path):
    shares = [f"{tree}.rollout.gpu_memory_utilization=0.4" for tree in ("actor_rollout_ref", "hl")]  # generation fits
    overrides = ["mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2", *shares]
    packed = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    assert attention_fallback(packed, on_gpu=True, flash_attn=True) == []  # flash-attn: packed, nothing lowered
    assert padded_budgets(_plan(packed)) == {}
    config = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    attention_fallback(config, on_gpu=True, flash_attn=False)
    assert not config.actor_rollout_ref.model.use_remove_padding and not config.hl.model.use_remove_padding
    plan = _plan(config)
    update = {phase.name: phase for phase in plan.sums[0].phases}["LL update"]
    per_token = VOCAB * (5 + 2) * 2  # padded update: logits copies and the unchunked entropy, bf16
    # padded activations: keys and values repeated to the 24 query heads; checkpointed: 28 layers' hidden states
    layer = 2 * ((4 + 2 * 2) * 3072 + 4) + 2 * (4 * 3072 + 5120) + 4 * 24 + 4 * 2 * 8192  # + the mask's 5,120-row
    activations = 28 * 2 * 3072 + layer + (4 + 2 * 2) * 3072 + 4
    contexts = 2 * CUDA_CONTEXT  # one rank per level: no NCCL buffers
    assert (update.logits.per_token, update.logits.activations_per_token) == (per_token, activations)
    assert update.total == contexts + 16 * P3B + 2 * 16384 * (per_token + activations) > D80
    usable = int(0.9 * D80)  # the 10 % margin kept free
    budget = (usable - contexts - 16 * P3B) // (2 * (per_token + activations))  # beside the state, vLLM asleep
    log_prob_per_token = VOCAB * (3 + 2) * 2 + layer
    log_prob_budget = (usable - contexts - 12 * P3B) // (2 * log_prob_per_token)
    assert (budget, log_prob_budget) == (5796, 13155)  # ≥ the longest row, 1024 + 4096
    expected = {
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": log_prob_budget,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": budget,
        "hl.rollout.log_prob_max_token_len_per_gpu": log_prob_budget,
        "hl.actor.ppo_max_token_len_per_gpu": budget,
    }
    assert padded_budgets(plan) == expected
    ref = [f"{tree}.ref.log_prob_max_token_len_per_gpu={log_prob_budget}" for tree in ("actor_rollout_ref", "hl")]
    assert lower_padded_budgets(config, plan) == [
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={log_prob_budget}", ref[0],
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"hl.rollout.log_prob_max_token_len_per_gpu={log_prob_budget}", ref[1],
        f"hl.actor.ppo_max_token_len_per_gpu={budget}",
    ]  # fmt: skip
    lowered = _plan(config)
    assert all(group.fits for group in lowered.sums), "\n".join(render_memory(lowered))
    assert config.hl.actor.ppo_max_token_len_per_gpu == budget

    small = _plan(config, device=60 * GIB)  # the longest row's padded logits do not fit beside the state
    # the log-prob passes can be lowered, the updates cannot (they would need less than the longest row)
    assert [key.split(".", 1)[1] for key in padded_budgets(small)] == ["rollout.log_prob_max_token_len_per_gpu"] * 2
    with pytest.raises(ConfigError, match="install flash-attn"):
        refuse_overcommit(small, allowed=False)


def test_without_dynamic_batching_a_micro_batch_is_its_rows_of_the_longest_row(base, tmp_path):
    """``use_dynamic_bsz=false``: verl cuts micro-batches by ``…micro_batch_size_per_gpu`` rows, and the token
    budgets do not act; each row is up to the longest (1,024 + 4,096 tokens). Padded (no flash-attn) a start-up
    lowers the rows that do not fit; a missing row count is named."""
    rows = ["actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "mlmt.ll_gpus=1", "mlmt.hl_gpus=1",
            "trainer.n_gpus_per_node=2"]  # fmt: skip
    plan = _plan(_config(base, tmp_path, rows))
    log_prob, update = plan.levels["ll"].logits
    assert (update.key, update.budget, update.tokens) == ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4,
                                                          4 * 5120)  # fmt: skip
    assert (log_prob.key, log_prob.tokens) == ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 8 * 5120)
    assert update.bytes == 4 * 5120 * VOCAB * (3 * 2 + 8) and update.activations == 20480 * UPDATE_ACTIVATIONS // 16384
    assert plan.levels["hl"].logits[1].tokens == 16384  # the HL keeps its token budget

    more = [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",  # the reference runs the same pass
        *[f"{tree}.rollout.gpu_memory_utilization=0.4" for tree in ("actor_rollout_ref", "hl")],  # generation fits
    ]
    padded = _config(base, tmp_path, [*rows, *more], LLAMA_3B)
    attention_fallback(padded, on_gpu=True, flash_attn=False)
    lowered = lower_padded_budgets(padded, _plan(padded))
    (log_prob_rows,) = [int(item.split("=")[1]) for item in lowered if ".rollout.log_prob_micro" in item]
    assert (
        1 <= log_prob_rows < 64
        and f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={log_prob_rows}" in lowered
    )
    after = _plan(padded)
    assert after.sums[0].fits, "\n".join(render_memory(after))
    assert after.levels["ll"].logits[0].tokens == log_prob_rows * 5120

    missing = _config(base, tmp_path, [*rows, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"])
    with pytest.raises(MemoryUnavailable, match=r"actor_rollout_ref\.actor\.use_dynamic_bsz=false and "
                       r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu is not set"):  # fmt: skip
        _plan(missing)


# verl's default of both log-prob budgets (rollout and reference) of a tree: its actor's update budget, named by the
# path it has in the workers' config, where the tree is actor_rollout_ref
VERL_LOG_PROB_BUDGET = "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}"


def test_each_level_s_budgets_are_its_own_when_the_levels_differ(base, tmp_path):
    """The HL's log-prob budgets interpolate ``actor_rollout_ref.actor.ppo_max_token_len_per_gpu``: the LL's key in
    the full config, the HL's own in the view its workers get. The plan and the lowering read that view."""
    log_prob = [f"{tree}.{role}.log_prob_max_token_len_per_gpu={VERL_LOG_PROB_BUDGET}"
                for tree in ("actor_rollout_ref", "hl") for role in ("rollout", "ref")]  # fmt: skip
    shares = [f"{tree}.rollout.gpu_memory_utilization=0.4" for tree in ("actor_rollout_ref", "hl")]  # generation fits
    overrides = ["mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2", *log_prob, *shares,
                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"]  # the HL's stays 16,384  # fmt: skip
    config = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    assert config.hl.rollout.log_prob_max_token_len_per_gpu == 8192  # the full config resolves it through the LL
    levels = _plan(config).levels
    budgets = {level: {peak.key: peak.budget for peak in memory.logits} for level, memory in levels.items()}
    assert budgets == {
        "ll": {"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 8192,
               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192},
        "hl": {"hl.rollout.log_prob_max_token_len_per_gpu": 16384, "hl.actor.ppo_max_token_len_per_gpu": 16384},
    }  # fmt: skip

    attention_fallback(config, on_gpu=True, flash_attn=False)  # padded passes
    plan = _plan(config)
    hl_log_prob = {phase.name: phase for phase in plan.sums[1].phases}["HL log-prob pass"]
    # padded log-prob pass: logits copies and the unchunked entropy, bf16, and one layer's activations
    layer = 2 * ((4 + 2 * 2) * 3072 + 4) + 2 * (4 * 3072 + 5120) + 4 * 24 + 4 * 2 * 8192  # the mask's 5,120-row
    per_token = VOCAB * (3 + 2) * 2 + layer
    update_per_token = VOCAB * (5 + 2) * 2 + 28 * 2 * 3072 + layer + (4 + 2 * 2) * 3072 + 4
    contexts, usable = 2 * CUDA_CONTEXT, int(0.9 * D80)  # one rank per level: no NCCL; the 10 % margin kept free
    # the HL's own 16,384-token budget (2 × as many padded tokens) beside its parameters and AdamW moments
    assert hl_log_prob.total == contexts + 12 * P3B + 2 * 16384 * per_token > usable
    log_prob_budget = (usable - contexts - 12 * P3B) // (2 * per_token)
    update_budget = (usable - contexts - 16 * P3B) // (2 * update_per_token)
    assert (log_prob_budget, update_budget) == (13155, 5796)
    assert lower_padded_budgets(config, plan) == [
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={update_budget}",
        f"hl.rollout.log_prob_max_token_len_per_gpu={log_prob_budget}",
        f"hl.ref.log_prob_max_token_len_per_gpu={log_prob_budget}",  # read as the HL's 16,384, not the LL's 8,192
        f"hl.actor.ppo_max_token_len_per_gpu={update_budget}",
    ]
    hl = level_view(config, "hl").actor_rollout_ref
    assert (hl.rollout.log_prob_max_token_len_per_gpu, hl.ref.log_prob_max_token_len_per_gpu) == (13155, 13155)
    assert config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == update_budget  # the LL's follows its actor
    assert all(group.fits for group in _plan(config).sums)


def test_start_up_refuses_an_overflow_under_plan_only_after_writing_the_plan_and_never_stops_a_cpu_run(tmp_path):
    import pandas as pd

    from agent_system.launcher.main import preflight

    train = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": [f"p{i}" for i in range(8)]}).to_parquet(train)
    model = _model(tmp_path / "llama-1b", LLAMA_1B)
    run = tmp_path / "run"
    config = compose_config([f"actor_rollout_ref.model.path={model}", f"hl.model.path={model}",
                             f"data.train_files={train}", f"trainer.default_local_dir={run}",
                             "mlmt.plan_device_gib=8", "mlmt.plan_only=true"])  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"LL needs about .* of 7\.20 GiB usable \(8\.00 GiB.*plan_allow_overcommit=true"
    ):
        preflight(config)  # fp32 actor state alone: 16 bytes × 1.24B parameters
    assert (run / "run_plan.json").is_file()  # the plan is written (and logged) before the refusal
    config.mlmt.plan_allow_overcommit = True
    assert not preflight(config).memory.sums[0].fits  # started anyway, the notice a warning
    config.mlmt.plan_allow_overcommit, config.mlmt.plan_only = False, False
    preflight(config)  # a CPU run: the CPU backend holds no GPU memory, nothing is refused
