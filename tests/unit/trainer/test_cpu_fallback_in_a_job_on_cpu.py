"""A GPU job that got no GPU is refused, not run on the CPU backend (issue 42, point 9): inside a Slurm job, a run
without a visible GPU and a model of a billion parameters or more stops at start-up with one line naming the job, the
model and how to request GPUs (was: the sbatch header requests no GPU and such a job fell silently to the CPU path).

    .venv/bin/python -m pytest tests/unit/trainer/test_cpu_fallback_in_a_job_on_cpu.py
"""

from __future__ import annotations

import json

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import refuse_cpu_fallback_in_a_job

LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
TINY = {**LLAMA_1B, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000}


def _model(folder, shape) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(shape))
    return str(folder)


def test_a_billion_parameter_model_on_the_cpu_backend_in_a_slurm_job_is_refused(tmp_path):
    big, tiny = _model(tmp_path / "big", LLAMA_1B), _model(tmp_path / "tiny", TINY)
    config = compose_config([f"actor_rollout_ref.model.path={tiny}", f"hl.model.path={big}"])
    with pytest.raises(ConfigError, match=r"Slurm job 42 sees no GPU, so the run would train hl.model.path \(1.2B"):
        refuse_cpu_fallback_in_a_job(config, {"SLURM_JOB_ID": "42"})
    refuse_cpu_fallback_in_a_job(config, {})  # outside a job: a CPU run of any size is the user's choice
    small = compose_config([f"actor_rollout_ref.model.path={tiny}", f"hl.model.path={tiny}"])
    refuse_cpu_fallback_in_a_job(small, {"SLURM_JOB_ID": "42"})  # the tests' tiny models in a Slurm job: fine
