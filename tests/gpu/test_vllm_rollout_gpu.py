"""GPU path: `python -m verl.trainer.main_mlmt` with verl's vLLM rollout servers and NCCL (rollout.name=vllm).

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
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_mlmt",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.total_training_steps=2",
        "trainer.logger=[console]",
        "actor_rollout_ref.rollout.name=vllm",
        "hl.rollout.name=vllm",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
