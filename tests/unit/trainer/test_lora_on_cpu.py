"""LoRA per level without a run (issue 20): the run plan's trainable parameters, counted from a model's config.json
(checked against PEFT's own count on tiny models), the actor-state memory estimate with an adapter, and the start-up
refusal of LoRA keys that cannot act."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml
from config_copies import copier
from omegaconf import OmegaConf

from agent_system.config import LORA_KEY_DEFAULTS, ConfigError, compose_config
from agent_system.launcher.main import check_config, set_schedule_horizon
from agent_system.launcher.memory_estimate import (
    MemoryUnavailable,
    ModelShape,
    memory_plan,
    read_shape,
    render_memory,
    trainable_parameters,
)
from agent_system.launcher.plan import build_plan, render_markdown
from agent_system.models.tiny import build_tiny_model

ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = ["all-linear", ALL_SEVEN, ["q_proj", "v_proj"], r"model\.layers\.1\..*_proj", ["down_proj", "lm_head"]]


@pytest.fixture(scope="module")
def base():
    return copier(compose_config([]))  # composed once; each test edits a copy


def _edit(base, settings: dict):
    config = base()
    for key, value in settings.items():
        value = yaml.safe_load(value) if isinstance(value, str) else value
        OmegaConf.update(config, key, value, merge=False, force_add=True)
    return config


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny Qwen2 of agent_system.models.tiny (MHA), and one with grouped KV heads and an odd MLP width."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=128, num_layers=2)
    gqa_dir = tmp_path_factory.mktemp("gqa")
    config = Qwen2Config(vocab_size=300, hidden_size=256, intermediate_size=320, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(gqa_dir)
    return {"tiny": tiny, "gqa": str(gqa_dir)}


def _peft_count(path: str, rank: int, targets) -> tuple[int, int]:
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    total = sum(p.numel() for p in model.parameters())
    lora = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=2 * rank,
                                            target_modules=targets, bias="none"))  # fmt: skip
    return lora.get_nb_trainable_parameters()[0], total


@pytest.mark.parametrize("targets", TARGETS, ids=["all-linear", "all-seven", "q-v", "regex", "down-lm_head"])
@pytest.mark.parametrize("name", ["tiny", "gqa"])
def test_adapter_count_from_config_json_is_peft_count(models, name, targets):
    shape = read_shape(models[name], "model.path")
    model = OmegaConf.create({"lora_rank": 16, "lora_alpha": 32, "target_modules": targets})
    trainable = trainable_parameters(model, shape, "actor_rollout_ref.model")
    peft_trainable, total = _peft_count(models[name], 16, targets)
    assert shape.parameters == total
    assert trainable.trained == peft_trainable and trainable.held == total + peft_trainable
    assert "LoRA r 16, α 32" in trainable.lora
    full = trainable_parameters(OmegaConf.create({"lora_rank": 0}), shape, "m")
    assert (full.held, full.trained, full.lora) == (total, total, "")


def test_all_linear_is_the_explicit_seven_and_a_name_outside_the_model_is_not_counted(models):
    shape = read_shape(models["gqa"], "model.path")
    assert shape.lora_parameters(8, "all-linear") == shape.lora_parameters(8, ALL_SEVEN)
    # rank × (in + out) per layer, by hand: hidden 256, q 256, kv 64, intermediate 320, 3 layers
    per_layer = (256 + 256) + 2 * (256 + 64) + (256 + 256) + 2 * (256 + 320) + (320 + 256)
    assert shape.lora_parameters(8, "all-linear") == 8 * 3 * per_layer
    assert shape.lora_parameters(8, ALL_SEVEN, exclude_modules=["gate_proj"]) == 8 * 3 * (per_layer - 576)
    with pytest.raises(MemoryUnavailable, match=r"hl\.model\.target_modules: \['c_attn'\]"):
        shape.lora_parameters(8, ["q_proj", "c_attn"], key="hl.model")


def test_run_plan_shows_trainable_parameters_per_level(base, models):
    settings = {
        "actor_rollout_ref.model.path": models["tiny"],
        "hl.model.path": models["tiny"],
        "actor_rollout_ref.model.lora_rank": 16,
        "actor_rollout_ref.model.lora_alpha": 32,
        "actor_rollout_ref.model.target_modules": "all-linear",
    }
    config = _edit(base, settings)
    check_config(config)
    set_schedule_horizon(config, 100)
    plan = build_plan(config, 100, 4)
    ll, hl = plan.levels["ll"], plan.levels["hl"]
    lora, total = _peft_count(models["tiny"], 16, "all-linear")
    assert (ll.trainable_parameters, ll.parameters) == (lora, total)
    assert (hl.trainable_parameters, hl.parameters, hl.tuning) == (total, total, "full fine-tuning")
    text = render_markdown(plan)
    assert f"- trainable parameters: {lora:,} of {total:,}" in text and "LoRA r 16, α 32" in text
    assert f"- trainable parameters: {total:,} of {total:,} (100 %, full fine-tuning)" in text
    assert json.loads(json.dumps(plan.to_json()))["levels"]["ll"]["trainable_parameters"] == lora
    # the actor state: parameters of base + adapter, gradients and AdamW moments of the adapter only (fp32)
    memory = plan.memory.levels
    assert memory["ll"].actor_parameters == 4 * (total + lora) and memory["ll"].trained_parameters == lora
    assert (memory["ll"].actor_gradients, memory["ll"].actor_optimizer) == (4 * lora, 8 * lora)
    assert (memory["hl"].actor_gradients, memory["hl"].actor_optimizer) == (4 * total, 8 * total)
    assert "gradients and AdamW for its" in text


def test_lora_lowers_the_3b_actor_state_estimate(base, tmp_path):
    """Llama-3.2-3B's shape (config.json values, nothing downloaded), r 16 on all seven projections."""
    llama_3b = {"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "intermediate_size": 8192,
                "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(llama_3b))
    adapter = 16 * 28 * ((3072 + 3072) + 2 * (3072 + 1024) + (3072 + 3072) + 3 * (3072 + 8192))
    assert ModelShape.from_hf_config(llama_3b, "3B").lora_parameters(16, "all-linear") == adapter == 24_313_856
    settings = {"actor_rollout_ref.model.path": str(tmp_path), "hl.model.path": str(tmp_path),
                "mlmt.placement": "split", "mlmt.ll_gpus": 1, "mlmt.hl_gpus": 1}  # fmt: skip
    full = memory_plan(_edit(base, settings), None, "test", {"ll": False, "hl": False}).levels["ll"]
    settings |= {"actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 32}
    lora = memory_plan(_edit(base, settings), None, "test", {"ll": False, "hl": False}).levels["ll"]
    parameters = 3_212_749_824
    assert full.actor_parameters + full.actor_gradients + full.actor_optimizer == 16 * parameters
    assert lora.actor_parameters + lora.actor_gradients + lora.actor_optimizer == 4 * parameters + 16 * adapter


def test_verl_lora_defaults_are_the_ones_validation_compares_with():
    from verl.workers.config import HFModelConfig

    defaults = {field.name: field.default for field in dataclasses.fields(HFModelConfig)}
    assert {key: defaults[key] for key in LORA_KEY_DEFAULTS} == LORA_KEY_DEFAULTS
    assert defaults["lora_rank"] == 0


REJECTED = [
    ({"actor_rollout_ref.model.lora_alpha": 32}, ["actor_rollout_ref.model.lora_alpha=32", "lora_rank=0"]),
    ({"hl.model.target_modules": "[q_proj,v_proj]"}, ["hl.model.target_modules=['q_proj', 'v_proj']"]),
    ({"hl.model.lora_alpha": 32, "hl.model.target_modules": "all-linear"}, ["hl.model.lora_alpha=32"]),
    ({"actor_rollout_ref.model.lora_adapter_path": "/adapters/ll"}, ["actor_rollout_ref.model.lora_adapter_path"]),
    ({"actor_rollout_ref.model.lora_rank": -1}, ["actor_rollout_ref.model.lora_rank=-1"]),
    ({"hl.model.lora.dropout": 0.05, "hl.model.lora_rank": 16}, ["hl.model.lora.dropout=0.05", "no dropout key"]),
    ({"actor_rollout_ref.model.lora.rank": 16}, ["actor_rollout_ref.model.lora.rank=16"]),
    ({"hl.model.lora.merge": True}, ["hl.model.lora.merge=true"]),
    ({"mlmt.feedback": "self", "hl.model.lora_rank": 16}, ["hl.model.lora_rank=16", "mlmt.feedback=self"]),
    ({"hl.actor.checkpoint.save_lora_only": True}, ["hl.actor.checkpoint.save_lora_only=true", "lora_rank=0"]),
    ({"mlmt.hl.freeze": True, "hl.model.lora_rank": 16}, ["hl.model.lora_rank=16 with mlmt.hl.freeze=true"]),
    (
        {"mlmt.ll.freeze": True, "actor_rollout_ref.model.lora_rank": 8},
        ["actor_rollout_ref.model.lora_rank=8 with mlmt.ll.freeze=true", "lora_adapter_path"],
    ),
    # an adapter on the embeddings or the output layer: verl's FSDP2 engine fails to build it on an untied model
    # and drops it from the merged weights the rollout gets on a tied one (test_lora_embedding_targets_on_cpu.py)
    (
        {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": "[down_proj,lm_head]"},
        ["actor_rollout_ref.model.target_modules=['down_proj', 'lm_head'] puts an adapter on lm_head:"],
    ),
    ({"hl.model.lora_rank": 8, "hl.model.target_modules": "[q_proj,embed_tokens]"}, ["on model.embed_tokens:"]),
    ({"hl.model.lora_rank": 8, "hl.model.target_modules": "'.*(proj|head)'"}, ["puts an adapter on lm_head:"]),
    ({"hl.model.lora_rank": 8, "hl.model.target_modules": "'.*'"}, ["on model.embed_tokens and lm_head:"]),
]
ACCEPTED = [
    {"actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 32},
    {"hl.model.lora_rank": 16, "hl.model.lora_alpha": 32, "hl.model.target_modules": "[" + ",".join(ALL_SEVEN) + "]"},
    {"actor_rollout_ref.model.lora_rank": 8, "hl.model.lora_rank": 8, "hl.model.lora.merge": True},
    {"hl.model.lora_rank": 8, "hl.actor.checkpoint.save_lora_only": True},
    {"mlmt.hl.freeze": True, "hl.model.lora_rank": 16, "hl.model.lora_adapter_path": "/adapters/hl"},  # a trained one
    {"hl.model.lora_rank": 8, "hl.model.target_modules": r"'model\.layers\.1\..*_proj'"},  # a regex on projections
]


@pytest.mark.parametrize(("settings", "named"), REJECTED)
def test_lora_key_that_cannot_act_is_refused_by_name(base, settings, named):
    with pytest.raises(ConfigError) as error:
        check_config(_edit(base, settings))
    for text in named:
        assert text in str(error.value), (text, str(error.value))


@pytest.mark.parametrize("settings", ACCEPTED)
def test_lora_that_acts_is_accepted(base, settings):
    check_config(_edit(base, settings))


def test_a_lora_level_builds_no_reference_copy(base, models):
    """With a KL reference at both levels, the LoRA level's reference is its actor with the adapter off: its worker
    is built without a reference model (verl's role ``actor_rollout``), the plan says so, and the memory estimate
    holds no reference copy for it; the full fine-tuning level keeps its own."""
    from agent_system.config import level_view, reference_in_actor, reference_needed
    from agent_system.levels.policy import PolicyGroup

    settings = {"actor_rollout_ref.model.path": models["tiny"], "hl.model.path": models["tiny"],
                "actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 32,
                "mlmt.stages.beta_turn1": "[0.1]", "mlmt.stages.beta_turn2": "[0.1]"}  # fmt: skip
    config = _edit(base, settings)
    check_config(config)
    assert reference_needed(config) == {"ll": True, "hl": True}
    assert reference_in_actor(config) == {"ll": True, "hl": False}
    roles = {level: PolicyGroup.worker_class(level_view(config, level), True).kwargs["role"] for level in ("ll", "hl")}
    assert roles == {"ll": "actor_rollout", "hl": "actor_rollout_ref"}
    set_schedule_horizon(config, 100)
    plan = build_plan(config, 100, 4)
    assert "LoRA adapter switched off" in plan.levels["ll"].reference
    assert plan.levels["hl"].reference.startswith("initial weights")
    assert plan.memory.levels["ll"].reference_host == 0 < plan.memory.levels["hl"].reference_host
    assert "loaded adapter" not in plan.levels["ll"].reference
    memory = "\n".join(render_memory(plan.memory))
    assert "reference: no copy (a KL reference is the actor with its LoRA adapter off)" in memory
    assert re.search(r"reference: on the host, [0-9.]+ GiB per rank", memory)  # the full fine-tuning HL's copy


def test_the_plan_says_a_loaded_adapter_is_not_the_reference(base, models):
    """With ``lora_adapter_path`` the actor starts from that adapter, but its reference (adapter off) is the base."""
    settings = {"actor_rollout_ref.model.path": models["tiny"], "hl.model.path": models["tiny"],
                "hl.model.lora_rank": 16, "hl.model.lora_adapter_path": "/adapters/hl",
                "mlmt.stages.beta_turn2": "[0.1]"}  # fmt: skip
    config = _edit(base, settings)
    check_config(config)
    set_schedule_horizon(config, 100)
    reference = build_plan(config, 100, 4).levels["hl"].reference
    assert reference.startswith("the base model") and "not the loaded adapter /adapters/hl" in reference


def test_a_reference_refresh_with_lora_is_refused(base):
    settings = {"actor_rollout_ref.model.lora_rank": 16, "mlmt.ll.ref_refresh_freq": 10,
                "mlmt.stages.beta_turn3": "[0.1]"}  # fmt: skip
    with pytest.raises(ConfigError, match=r"mlmt.ll.ref_refresh_freq=10 with actor_rollout_ref.model.lora_rank=16"):
        check_config(_edit(base, settings))
