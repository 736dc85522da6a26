"""Checkpoints and exports with LoRA (issue 20, item 2) without a training run.

verl's own FSDP2 engine (``FSDPEngineWithLMHead``, the engine the trainer's actors run, registered for CPU by the
project) builds a tiny LoRA actor in one process (one rank, gloo, no Ray), moves its adapter off PEFT's zero
initialisation, takes one AdamW step and saves with its own checkpoint manager: a full checkpoint for the LL and an
adapters-only one (``checkpoint.save_lora_only``) for the HL. ``agent_system.launcher.export`` then writes each level
as merged weights and as a PEFT adapter folder, and both reproduce the actor's logits. The adapters-only checkpoint
is also loaded into a fresh engine, which gets the adapter and the optimizer back exactly.

    nice -n 19 .venv/bin/python -m pytest tests/unit/trainer/test_lora_export_on_cpu.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_system.launcher.export import export_checkpoint, parse_bases
from agent_system.trainer import state as st

pytestmark = pytest.mark.external  # trains a checkpoint in a subprocess

RANK, ALPHA = 4, 8

# Runs in a subprocess: the process group and verl's engine stay out of the test process.
SAVE_WITH_VERL = r"""
import json, os, sys
os.environ["VERL_PLATFORM"] = "cpu"
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

base, step_dir, rank, alpha, full_ft_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method=f"file://{step_dir}/.pg", rank=0, world_size=1)
import verl  # noqa: F401 - loads the project's plugin (the cpu platform and its FSDP engine registration)
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead


def engine(lora_only, lora_rank=rank):
    model = HFModelConfig(path=base, lora_rank=lora_rank, lora_alpha=alpha, use_remove_padding=False,
                          enable_gradient_checkpointing=False, override_config={"attn_implementation": "sdpa"})
    built = FSDPEngineWithLMHead(model_config=model, engine_config=FSDPEngineConfig(strategy="fsdp2"),
                                 optimizer_config=FSDPOptimizerConfig(lr=1e-2),
                                 checkpoint_config=CheckpointConfig(save_lora_only=lora_only))
    built.initialize()
    return built


def full(value):
    return value.full_tensor() if isinstance(value, DTensor) else value


def trained(level, seed, lora_only):
    actor = engine(lora_only)
    torch.manual_seed(seed)
    with torch.no_grad():  # PEFT starts lora_B at zero: move it so the adapter changes the model
        for name, param in actor.module.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    logits = actor.module(input_ids=torch.arange(1, 17)[None]).logits
    logits.float().pow(2).mean().backward()
    actor.optimizer.step()
    actor.optimizer.zero_grad()
    actor.save_checkpoint(f"{step_dir}/{level}", global_step=1)
    lora = {k: full(v).detach().clone() for k, v in actor.module.state_dict().items() if "lora_" in k}
    torch.save(lora, f"{step_dir}/{level}_lora.pt")
    return actor


trained("ll", 1, lora_only=False)
saved = trained("hl", 2, lora_only=True)
fresh = engine(lora_only=True)
fresh.load_checkpoint(f"{step_dir}/hl")
model_gap = max(float((full(a) - full(b)).abs().max()) for a, b in
                zip(saved.module.state_dict().values(), fresh.module.state_dict().values()))
before, after = saved.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
optim_gap = max(float((full(before[p][k]).float() - full(after[p][k]).float()).abs().max())
                for p in before for k in before[p])
full_ft = engine(lora_only=False, lora_rank=0)  # full fine-tuning: the export path without an adapter
with torch.no_grad():
    for param in full_ft.module.parameters():
        param.add_(0.01)
full_ft.save_checkpoint(full_ft_dir, global_step=1)
torch.save(full_ft.module(input_ids=torch.arange(1, 17)[None]).logits.float().detach(), f"{full_ft_dir}/logits.pt")
json.dump({"model_gap": model_gap, "optim_gap": optim_gap, "optim_entries": len(before)},
          open(f"{step_dir}/roundtrip.json", "w"))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def run(tiny_models, tmp_path_factory):
    """A run folder whose step 1 holds verl's LoRA checkpoints: ll full, hl adapters-only (module docstring)."""
    run_dir = tmp_path_factory.mktemp("lora_run")
    step = st.step_dir(run_dir / "checkpoints", 1)
    step.mkdir(parents=True)
    full_ft = run_dir / "full_ft_actor"  # a full fine-tuning checkpoint, outside the run's checkpoints
    env = {**os.environ, "VERL_PLATFORM": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", SAVE_WITH_VERL, tiny_models["ll"], str(step), str(RANK), str(ALPHA), str(full_ft)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    st.write_trainer_state(run_dir / "checkpoints", 1, {"global_step": 1})
    st.mark_latest(run_dir / "checkpoints", 1)
    return {"dir": run_dir, "step": step, "base": tiny_models["ll"], "full_ft": full_ft}


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.arange(1, 17)[None]).logits.float()


def _actor(base: str, lora_file: Path):
    """The trained actor in float32 outside FSDP: the base with verl's LoRA config and the saved adapter tensors."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=RANK, lora_alpha=ALPHA, target_modules="all-linear")
    model = get_peft_model(model, config)
    result = model.load_state_dict(torch.load(lora_file), strict=False)
    assert not result.unexpected_keys
    return model


def test_verl_checkpoint_layout(run):
    for level, lora_only in (("ll", False), ("hl", True)):
        folder = run["step"] / level
        names = {path.name for path in folder.iterdir()}
        assert {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "huggingface"} <= names
        assert json.loads((folder / "lora_train_meta.json").read_text()) == {
            "r": RANK,
            "lora_alpha": ALPHA,
            "task_type": "CAUSAL_LM",
        }
        keys = list(torch.load(folder / "model_world_size_1_rank_0.pt", weights_only=False))
        assert any(".lora_A.default.weight" in key for key in keys)
        assert all("lora_" in key for key in keys) == lora_only  # adapters-only: no base_layer tensors
        if not lora_only:
            assert any(".base_layer.weight" in key for key in keys)


def test_adapters_only_checkpoint_restores_adapter_and_optimizer_exactly(run):
    roundtrip = json.loads((run["step"] / "roundtrip.json").read_text())
    assert roundtrip["optim_entries"] == len(torch.load(run["step"] / "hl_lora.pt"))  # AdamW state: the adapter only
    assert roundtrip["model_gap"] == 0.0 and roundtrip["optim_gap"] == 0.0


def test_export_writes_merged_weights_and_a_peft_adapter(run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with pytest.raises(FileNotFoundError, match="--base hl=PATH"):
        export_checkpoint(str(run["dir"]), out=str(tmp_path / "no_base"))
    out = tmp_path / "export"
    written = export_checkpoint(str(run["dir"]), out=str(out), bases={"hl": run["base"]})
    assert written == {level: str(out / level) for level in ("ll", "ll_adapter", "hl", "hl_adapter")}

    base_logits = _logits(AutoModelForCausalLM.from_pretrained(run["base"], dtype=torch.float32))
    for level in ("ll", "hl"):
        adapter = out / f"{level}_adapter"
        assert {path.name for path in adapter.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
        adapter_config = json.loads((adapter / "adapter_config.json").read_text())
        assert (adapter_config["r"], adapter_config["lora_alpha"]) == (RANK, ALPHA)
        assert adapter_config["base_model_name_or_path"] == (run["base"] if level == "hl" else None)

        actor = _logits(_actor(run["base"], run["step"] / f"{level}_lora.pt"))
        moved = float((actor - base_logits).abs().max())
        merged = _logits(AutoModelForCausalLM.from_pretrained(str(out / level), dtype=torch.float32))
        over_base = AutoModelForCausalLM.from_pretrained(run["base"], dtype=torch.float32)
        peft = _logits(PeftModel.from_pretrained(over_base, str(adapter)))
        # bfloat16 weights (verl's merger casts every tensor): close to the actor, far from the base
        assert moved > 0.05, f"{level}: the adapter does not change the model ({moved})"
        assert float((merged - actor).abs().max()) < 0.1 * moved, level
        assert float((peft - actor).abs().max()) < 0.1 * moved, level
        assert not list((out / level).glob("lora_adapter"))


def test_a_full_fine_tuning_checkpoint_merges_as_before(run, tmp_path):
    from transformers import AutoModelForCausalLM

    from agent_system import verl_compat as vc

    merged = vc.merge_fsdp_checkpoint(str(run["full_ft"]), str(tmp_path / "ft"))
    assert (merged.folder, merged.adapter, merged.base_weights) == (str(tmp_path / "ft"), None, True)
    actor = torch.load(run["full_ft"] / "logits.pt")
    exported = _logits(AutoModelForCausalLM.from_pretrained(merged.folder, dtype=torch.float32))
    assert float((exported - actor).abs().max()) < 0.05  # bfloat16 forward in the actor, bfloat16 weights here


def test_export_refuses_a_malformed_base():
    with pytest.raises(ValueError, match="'ll'"):
        parse_bases(["ll"])
    with pytest.raises(ValueError, match="'critic=/x'"):
        parse_bases(["critic=/x"])
    assert parse_bases(["ll=a", "hl=b"]) == {"ll": "a", "hl": "b"}
