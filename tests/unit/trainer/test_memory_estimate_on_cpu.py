"""The per-device GPU memory estimate (agent_system/trainer/memory_estimate.py) against hand computation for
Llama-3.2-1B and -3B shapes, written here from their public config.json values (nothing is downloaded)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml
from omegaconf import OmegaConf

from agent_system.trainer.config import ConfigError, compose_config
from agent_system.trainer.memory_estimate import (
    GIB,
    MemoryUnavailable,
    ModelShape,
    device_memory,
    device_memory_setting,
    memory_plan,
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
GPU_LIKE = [  # the CPU overlay's settings replaced by verl's GPU ones (bf16 vLLM sized by gpu_memory_utilization)
    f"{tree}.rollout.{key}"
    for tree in ("actor_rollout_ref", "hl")
    for key in ("dtype=bfloat16", "engine_kwargs.vllm.kv_cache_memory_bytes=null")
] + ["data.max_prompt_length=1024", "data.max_response_length=4096", "hl.rollout.response_length=4096"]


def _model(folder, hf_config: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config))
    return str(folder)


@pytest.fixture(scope="module")
def base():
    return compose_config(GPU_LIKE)  # composed once (Hydra is slow on a loaded machine); each test edits a copy


def _config(base, tmp_path, overrides, ll=LLAMA_1B, hl=LLAMA_1B):
    config = copy.deepcopy(base)
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
    assert ll_sum.levels == ["ll"] and ll_sum.total == 4 * P1B + 42_949_672_960 and ll_sum.fits
    assert hl_sum.levels == ["hl"] and plan.levels["hl"].reference_host == 0 and not plan.notices


def test_a_3b_colocated_run_with_a_critic_fits_eight_80_gib_devices_but_not_one(base, tmp_path):
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
    assert shared.total == 2 * 6_425_499_648 + 6_425_505_796 + 2 * 30_064_771_072 == 79_406_047_236
    assert shared.fits and not plan.notices  # 73.95 GiB of 80

    one = _plan(_config(base, tmp_path, [*overrides[:2], "trainer.n_gpus_per_node=1", *shares], LLAMA_3B, LLAMA_3B))
    assert one.sums[0].total == 16 * P3B * 2 + 16 * (P3B + 3073) + 2 * 30_064_771_072 and not one.sums[0].fits
    assert len(one.notices) == 1 and one.notices[0].startswith("GPU memory: LL + HL need about 199.62 GiB")


def test_offload_and_fsdp_size_move_and_reshard_the_actor_state(base, tmp_path):
    shared = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=8"]
    fsdp = "actor_rollout_ref.actor.fsdp_config"
    param = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.param_offload=true"])).levels["ll"]
    assert (param.actor_parameters, param.actor_gradients, param.actor_optimizer) == (0, 0, 8 * P1B // 8)
    assert param.actor_host == 8 * P1B // 8 and param.offload == [f"{fsdp}.param_offload=true"]
    optim = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.optimizer_offload=true"])).levels["ll"]
    assert (optim.actor_parameters, optim.actor_optimizer, optim.actor_host) == (P1B // 2, 0, P1B)
    policy = _plan(_config(base, tmp_path, [*shared, f"{fsdp}.offload_policy=true"])).levels["ll"]
    assert policy.fixed == policy.vllm_budget * 0 and policy.actor_host == 16 * P1B // 8
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
    assert ll_sum.total is None and ll_sum.fits is None and ll_sum.fraction == 0.5
    assert ll_sum.smallest_device == math.ceil(16 * P1B / 0.5) and plan.levels["ll"].kv_sequences is None
    text = "\n".join(render_memory(plan))
    assert f"= {16 * P1B / GIB:.2f} GiB + 0.5 × device; fits a device of at least {32 * P1B / GIB:.2f} GiB" in text
    assert "KV capacity not known here" in text


def test_a_vllm_budget_without_room_for_one_sequence_is_a_notice(base, tmp_path):
    plan = _plan(_config(base, tmp_path, ["actor_rollout_ref.rollout.gpu_memory_utilization=0.05"]), device=24 * GIB)
    assert plan.levels["ll"].kv_sequences == 0  # 1.2 GiB of budget, 2.3 GiB of weights
    assert any("vLLM will refuse to start" in notice and "LL's" in notice for notice in plan.notices)


@pytest.mark.parametrize("value", ["abc", 0, -8, True, float("nan")])
def test_a_bad_device_size_is_rejected_by_name(base, value):
    config = copy.deepcopy(base)
    config.mlmt.plan_device_gib = value
    with pytest.raises(ConfigError, match=r"mlmt.plan_device_gib=.*a number above 0"):
        device_memory_setting(config)


def test_the_device_size_on_cpu_is_the_setting_or_not_known(base):
    size, source = device_memory(base)
    assert size is None and "not known here" in source and "mlmt.plan_device_gib" in source
    config = compose_config(["mlmt.plan_device_gib=79.5"])  # the key as the command line gives it
    assert device_memory(config) == (int(79.5 * GIB), "mlmt.plan_device_gib=79.5")


def test_a_model_folder_without_config_json_makes_the_estimate_unavailable(base, tmp_path):
    config = copy.deepcopy(base)
    config.actor_rollout_ref.model.path = str(tmp_path)
    with pytest.raises(MemoryUnavailable, match=f"actor_rollout_ref.model.path={tmp_path}: no config.json"):
        memory_plan(config, None, "", {"ll": False, "hl": False})
