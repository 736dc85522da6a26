"""A GPU job that got no GPU is refused, not run on the CPU backend (issue 42, point 9): inside a Slurm job, a run
without a visible GPU and a model of a billion parameters or more stops at start-up with one line naming the job, the
model and how to request GPUs (was: the sbatch header requests no GPU and such a job fell silently to the CPU path).

    .venv/bin/python -m pytest tests/unit/trainer/test_cpu_fallback_in_a_job_on_cpu.py
"""

from __future__ import annotations

import pytest
from model_shapes import LLAMA_1B, TINY, model_folder

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import refuse_cpu_fallback_in_a_job


def test_a_billion_parameter_model_on_the_cpu_backend_in_a_slurm_job_is_refused(tmp_path):
    big, tiny = model_folder(tmp_path / "big", LLAMA_1B), model_folder(tmp_path / "tiny", TINY)
    config = compose_config([f"actor_rollout_ref.model.path={tiny}", f"hl.model.path={big}"])
    with pytest.raises(ConfigError, match=r"Slurm job 42 sees no GPU, so the run would train hl.model.path \(1.2B"):
        refuse_cpu_fallback_in_a_job(config, {"SLURM_JOB_ID": "42"})
    refuse_cpu_fallback_in_a_job(config, {})  # outside a job: a CPU run of any size is the user's choice
    small = compose_config([f"actor_rollout_ref.model.path={tiny}", f"hl.model.path={tiny}"])
    refuse_cpu_fallback_in_a_job(small, {"SLURM_JOB_ID": "42"})  # the tests' tiny models in a Slurm job: fine
