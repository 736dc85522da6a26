"""The per-device GPU memory estimate (agent_system/launcher/memory_estimate.py) against hand computation for
Llama-3.2-1B and -3B shapes, written here from their public config.json values (nothing is downloaded)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from config_copies import copier
from omegaconf import OmegaConf

from agent_system.config import ConfigError, compose_config, level_view
from agent_system.launcher.gpu_checks import attention_fallback, lower_padded_budgets
from agent_system.launcher.memory_estimate import (
    ALLOW_KEY,
    GIB,
    MemoryUnavailable,
    ModelShape,
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
    # asleep outside generation, packed sequences with flash-attn, bf16 compute, 16k-token micro-batches)
    f"{tree}.{key}"
    for tree in ("actor_rollout_ref", "hl")
    for key in ("rollout.dtype=bfloat16", "rollout.engine_kwargs.vllm.kv_cache_memory_bytes=null",
                "rollout.free_cache_engine=true", "model.use_remove_padding=true",
                "actor.ppo_max_token_len_per_gpu=16384",
                "rollout.log_prob_max_token_len_per_gpu=16384", "actor.entropy_coeff=0.001")
] + [f"++{tree}.actor.fsdp_config.mixed_precision.param_dtype=bf16" for tree in ("actor_rollout_ref", "hl")] + [
    "data.max_prompt_length=1024", "data.max_response_length=4096", "hl.rollout.response_length=4096"]  # fmt: skip
VOCAB = 128256
# the logits peak of a 16,384-token packed micro-batch (docs/RUN_PLAN.md): the update keeps the bf16 logits, their
# temperature-scaled copy and their gradient (3 × 2 bytes) and the chunked entropy's fp32 copy and softmax (8 bytes);
# a log-prob pass the two bf16 copies and one transient fp32 entropy chunk of 2,048 rows (12 bytes each)
UPDATE_LOGITS = 16384 * VOCAB * (3 * 2 + 8)  # 27.40 GiB
LOG_PROB_LOGITS = 16384 * VOCAB * 2 * 2 + 2048 * VOCAB * 12


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
    assert phases == {"generation": 3 * P1B + 42_949_672_960, "LL log-prob pass": 3 * P1B + LOG_PROB_LOGITS,
                      "LL update": 4 * P1B + UPDATE_LOGITS}  # fmt: skip
    assert ll_sum.levels == ["ll"] and ll_sum.peak == "generation" and ll_sum.total == 3 * P1B + 42_949_672_960
    assert ll_sum.fits and hl_sum.levels == ["hl"] and plan.levels["hl"].reference_host == 0 and not plan.notices


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
    # generation: both actors' parameters and moments (12 bytes a parameter), the critic's, both vLLM shares
    assert shared.peak == "generation"
    assert shared.total == 2 * 12 * P3B // 8 + 3 * 1_606_376_449 + 2 * 30_064_771_072 == 74_586_920_963
    assert shared.fits and not plan.notices  # 69.46 GiB of 80

    one = _plan(_config(base, tmp_path, [*overrides[:2], "trainer.n_gpus_per_node=1", *shares], LLAMA_3B, LLAMA_3B))
    assert one.sums[0].total == 12 * P3B * 2 + 12 * (P3B + 3073) + 2 * 30_064_771_072 and not one.sums[0].fits
    assert len(one.notices) == 1 and one.notices[0].startswith("GPU memory: LL + HL need about 163.72 GiB")


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
    assert (generation.fixed, generation.fraction) == (12 * P1B, 0.5)  # + half the device for vLLM
    assert (update.fixed, update.fraction) == (16 * P1B + UPDATE_LOGITS, 0.0)  # vLLM asleep
    assert ll_sum.total is None and ll_sum.fits is None and ll_sum.peak == "LL update"
    assert ll_sum.smallest_device == max(math.ceil(12 * P1B / 0.5), 16 * P1B + UPDATE_LOGITS)
    assert plan.levels["ll"].kv_sequences is None
    text = "\n".join(render_memory(plan))
    smallest = (16 * P1B + UPDATE_LOGITS) / GIB
    assert f"(LL update): LL = {smallest:.2f} GiB; fits a device of at least {smallest:.2f} GiB" in text
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
    # generation: fp32 parameters and AdamW moments (12 bytes a parameter over 2 ranks) beside vLLM's 0.5 × 80 GiB;
    # the update: with the gradients (16 bytes a parameter) and the logits, vLLM asleep. Both exceed 80 GiB.
    assert phases["generation"] == 12 * p7b // 2 + D80 // 2 > D80
    assert phases["HL update"] == 16 * p7b // 2 + logits > D80
    assert hl.peak == "HL update" and hl.total == phases["HL update"] and not hl.fits
    with pytest.raises(ConfigError) as refused:
        refuse_overcommit(plan, allowed=False)
    message = str(refused.value)
    assert f"needs about {hl.total / GIB:.2f} GiB on each of the 2 HL devices (mlmt.hl_gpus)" in message
    assert "of 80.00 GiB (test;" in message and "at the peak (HL update)" in message
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


def test_the_logits_peak_scales_with_vocabulary_and_token_budget_as_the_formula_says():
    def peak(budget, vocab, packed=True, pass_name="update", entropy=True):
        return logits_peak(pass_name, "k", budget, packed, vocab, 2, entropy, True, 5120)

    assert peak(16384, 151_936).bytes == 16384 * 151_936 * (3 * 2 + 8)  # 37.1 GiB for Qwen2.5's vocabulary
    assert peak(8192, 151_936).bytes * 2 == peak(16384, 151_936).bytes
    assert peak(16384, 75_968).bytes * 2 == peak(16384, 151_936).bytes
    assert peak(16384, 151_936, entropy=False).bytes == 16384 * 151_936 * 6  # no entropy term: no fp32 copies
    assert peak(16384, 151_936, pass_name="log_prob").bytes == 16384 * 151_936 * 4 + 2048 * 151_936 * 12
    padded = peak(16384, 151_936, packed=False)  # twice the tokens; unchunked entropy and the real tokens' copies
    assert (padded.tokens, padded.layout) == (32768, "padded")
    assert padded.bytes == 32768 * 151_936 * (5 + 2) * 2


def test_without_flash_attn_the_padded_budgets_are_lowered_to_what_fits_or_refused(base, tmp_path):
    overrides = ["mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2"]
    packed = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    assert attention_fallback(packed, on_gpu=True, flash_attn=True) == []  # flash-attn: packed, nothing lowered
    assert padded_budgets(_plan(packed)) == {}
    config = _config(base, tmp_path, overrides, LLAMA_3B, LLAMA_3B)
    attention_fallback(config, on_gpu=True, flash_attn=False)
    assert not config.actor_rollout_ref.model.use_remove_padding and not config.hl.model.use_remove_padding
    plan = _plan(config)
    update = {phase.name: phase for phase in plan.sums[0].phases}["LL update"]
    per_token = VOCAB * (5 + 2) * 2  # padded update: logits copies and the unchunked entropy, bf16
    assert update.logits.per_token == per_token and update.total == 16 * P3B + 2 * 16384 * per_token > D80
    room = D80 - 16 * P3B  # beside the actor's state in its update (vLLM asleep)
    budget = room // (2 * per_token)
    assert budget == 9605  # ≥ the longest row, 1024 + 4096
    expected = {
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": budget,
        "hl.actor.ppo_max_token_len_per_gpu": budget,
    }
    assert padded_budgets(plan) == expected  # the log-prob passes fit as they are
    assert lower_padded_budgets(config, plan) == [f"{key}={value}" for key, value in expected.items()]
    lowered = _plan(config)
    assert all(group.fits for group in lowered.sums) and config.hl.actor.ppo_max_token_len_per_gpu == budget

    small = _plan(config, device=60 * GIB)  # the longest row's padded logits do not fit beside the state
    # the log-prob passes can be lowered, the updates cannot (they would need less than the longest row)
    assert [key.split(".", 1)[1] for key in padded_budgets(small)] == ["rollout.log_prob_max_token_len_per_gpu"] * 2
    with pytest.raises(ConfigError, match="install flash-attn"):
        refuse_overcommit(small, allowed=False)


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

    attention_fallback(config, on_gpu=True, flash_attn=False)  # padded passes, on 70 GiB devices
    plan = _plan(config, device=70 * GIB)
    hl_log_prob = {phase.name: phase for phase in plan.sums[1].phases}["HL log-prob pass"]
    per_token = VOCAB * (3 + 2) * 2  # padded log-prob pass: logits copies and the unchunked entropy, bf16
    # the HL's own 16,384-token budget (2 × as many padded tokens) beside its parameters and AdamW moments
    assert hl_log_prob.total == 12 * P3B + 2 * 16384 * per_token > 70 * GIB
    log_prob_budget = (70 * GIB - 12 * P3B) // (2 * per_token)
    update_budget = (70 * GIB - 16 * P3B) // (2 * VOCAB * (5 + 2) * 2)
    assert (log_prob_budget, update_budget) == (14271, 6615)
    assert lower_padded_budgets(config, plan) == [
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={update_budget}",
        f"hl.rollout.log_prob_max_token_len_per_gpu={log_prob_budget}",
        f"hl.ref.log_prob_max_token_len_per_gpu={log_prob_budget}",  # read as the HL's 16,384, not the LL's 8,192
        f"hl.actor.ppo_max_token_len_per_gpu={update_budget}",
    ]
    hl = level_view(config, "hl").actor_rollout_ref
    assert (hl.rollout.log_prob_max_token_len_per_gpu, hl.ref.log_prob_max_token_len_per_gpu) == (14271, 14271)
    assert config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == update_budget  # the LL's follows its actor
    assert all(group.fits for group in _plan(config, device=70 * GIB).sums)


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
    with pytest.raises(ConfigError, match=r"LL needs about .* of 8\.00 GiB .*set mlmt\.plan_allow_overcommit=true"):
        preflight(config)  # fp32 actor state alone: 16 bytes × 1.24B parameters
    assert (run / "run_plan.json").is_file()  # the plan is written (and logged) before the refusal
    config.mlmt.plan_allow_overcommit = True
    assert not preflight(config).memory.sums[0].fits  # started anyway, the notice a warning
    config.mlmt.plan_allow_overcommit, config.mlmt.plan_only = False, False
    preflight(config)  # a CPU run: the CPU backend holds no GPU memory, nothing is refused
