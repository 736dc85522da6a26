"""GPU path: `python -m verl.trainer.main_mlmt` with verl's vLLM rollout servers and NCCL (rollout.name=vllm), on ONE
GPU with both levels colocated, tiny Qwen2 models built here (a different tokenizer per level) and a 2-problem
batch of the embedded dataset: nothing is downloaded or read outside the repository.

Marked `gpu` and skipped on machines without CUDA (all of this project's CI machines): counted as not run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_two_steps_with_vllm(tmp_path):
    from agent_system.models.tiny import build_tiny_model

    ll = build_tiny_model(tmp_path / "models" / "ll", seed=0, vocab_size=512)
    hl = build_tiny_model(tmp_path / "models" / "hl", seed=1, vocab_size=640)
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_mlmt",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"actor_rollout_ref.model.path={ll}",
        f"hl.model.path={hl}",
        "trainer.total_training_steps=2",
        "trainer.logger=[console]",
        "actor_rollout_ref.rollout.name=vllm",
        "hl.rollout.name=vllm",
        "mlmt.placement=colocated",
        "trainer.n_gpus_per_node=1",
        "data.train_batch_size=2",
        "data.max_prompt_length=768",
        "data.max_response_length=32",
        "hl.rollout.response_length=32",
        "mlmt.dataset.n_train=16",
        "mlmt.dataset.n_val=2",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
