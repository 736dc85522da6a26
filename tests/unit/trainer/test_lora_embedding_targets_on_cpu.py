"""Why start-up refuses a LoRA adapter on the input embeddings or the output layer (``target_modules`` naming
``embed_tokens`` or ``lm_head``; agent_system/config.py, ``_reject_inert_lora``): what verl 0.9.1's own FSDP2 engine
(``FSDPEngineWithLMHead``, one rank, gloo, no Ray) does with one.

* On a model whose output layer has its own weight, the engine cannot be built: ``fully_shard`` fails on PEFT's
  wrapped layer with a ``TypeError`` (the worker's start-up would be a bare stack trace).
* On a model that ties them (SmolLM2, Qwen2.5 up to 3B), ``lora.merge=true`` sends the rollout the projections with
  their adapters merged in, but the output layer and the embeddings as the base's: the rollout would sample from
  another model than the one trained.

If a verl upgrade changes either, this test fails and the refusal should be revisited. About 20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.external  # verl's engine runs in a subprocess

# argv: out folder, tied|untied, comma-separated target modules; prints one JSON line
ENGINE = r"""
import json, os, sys
os.environ["VERL_PLATFORM"] = "cpu"
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

out, tying, targets = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
dist.init_process_group("gloo", init_method=f"file://{out}/.pg_{tying}", rank=0, world_size=1)
import verl  # noqa: F401 - loads the project's plugin (the cpu platform and its FSDP engine registration)
from transformers import AutoModelForCausalLM
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from agent_system.models.tiny import build_tiny_model

base = build_tiny_model(f"{out}/{tying}", seed=0, tie_word_embeddings=tying == "tied")
model = HFModelConfig(path=base, lora_rank=4, lora_alpha=8, target_modules=targets, lora={"merge": True},
                      use_remove_padding=False, enable_gradient_checkpointing=False,
                      override_config={"attn_implementation": "sdpa"})
engine = FSDPEngineWithLMHead(model_config=model, engine_config=FSDPEngineConfig(strategy="fsdp2"),
                              optimizer_config=FSDPOptimizerConfig(lr=1e-2), checkpoint_config=CheckpointConfig())
try:
    engine.initialize()
except Exception as exc:
    print(json.dumps({"build_error": f"{type(exc).__name__}: {exc}"}))
    sys.exit()
torch.manual_seed(1)
with torch.no_grad():  # PEFT starts lora_B at zero: move it so the adapter changes the model
    for name, param in engine.module.named_parameters():
        if "lora_B" in name:
            param.copy_(torch.randn_like(param) * 0.5)
tensors, _ = engine.get_per_tensor_param()  # what the rollout gets (the merge path)
sent = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float() for k, v in tensors}
base_weights = AutoModelForCausalLM.from_pretrained(base).state_dict()
names = ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight")
print(json.dumps({name: float((sent[name] - base_weights[name]).abs().max()) for name in names}))
dist.destroy_process_group()
"""


def _engine(tmp_path, tying: str, targets: str) -> dict:
    env = {**os.environ, "VERL_PLATFORM": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, str(tmp_path), tying, targets],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("targets", ["q_proj,lm_head", "q_proj,embed_tokens"])
def test_verls_engine_cannot_build_an_embedding_adapter_on_an_untied_model(tmp_path, targets):
    result = _engine(tmp_path, "untied", targets)
    assert result.get("build_error", "").startswith("TypeError: __class__ assignment"), result


@pytest.mark.parametrize("targets", ["q_proj,lm_head", "q_proj,embed_tokens"])
def test_lora_merge_leaves_an_embedding_adapter_out_of_the_rollouts_weights_on_a_tied_model(tmp_path, targets):
    result = _engine(tmp_path, "tied", targets)
    assert result["model.layers.0.self_attn.q_proj.weight"] > 0.1, result  # the projections' adapter is merged
    # the embeddings and the output layer go out as the base's (bfloat16 rounding apart)
    assert result["lm_head.weight"] < 0.01 and result["model.embed_tokens.weight"] < 0.01, result
