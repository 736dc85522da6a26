"""Without data, a run that names real models refuses at start-up (issue 42, point 1): it trained them on the embedded
arithmetic task with one INFO line. The embedded task stays the default of the quick start (``smollm2``) and of the
tests' tiny models; a hub name is refused before it is downloaded.

    .venv/bin/python -m pytest -q tests/unit/data/test_embedded_task_refusal_on_cpu.py
"""

from __future__ import annotations

import pytest
from model_shapes import LLAMA_1B, TINY, model_folder

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import prepare_config, refuse_embedded_task_for_real_models
from agent_system.models.resolve import ModelPathError

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def test_real_models_without_data_are_refused_naming_the_fix(tmp_path):
    big, tiny = model_folder(tmp_path / "big", LLAMA_1B), model_folder(tmp_path / "tiny", TINY)
    refuse_embedded_task_for_real_models({"actor_rollout_ref.model.path": "smollm2", "hl.model.path": tiny})
    # a folder that does not exist is left to the model-path resolution, which names it ("no such folder")
    refuse_embedded_task_for_real_models({"actor_rollout_ref.model.path": str(tmp_path / "missing")})
    for real in (big, QWEN):
        with pytest.raises(ConfigError) as refused:
            refuse_embedded_task_for_real_models({"actor_rollout_ref.model.path": tiny, "hl.model.path": real})
        message = str(refused.value)
        assert message.startswith(f"data.train_files is not set, so hl.model.path={real} would train on the embedded")
        assert "actor_rollout_ref" not in message and "\n" not in message
        assert "python -m agent_system.data.prepare --from-hub --out data" in message


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub name that gets past the check fails to resolve, not downloads


def _prepare(overrides: list[str]):
    return prepare_config(compose_config(overrides), overrides)


def test_the_trainer_refuses_before_resolving_a_hub_model(offline):
    with pytest.raises(ConfigError, match=rf"so actor_rollout_ref.model.path={QWEN} would train on the embedded"):
        _prepare([f"actor_rollout_ref.model.path={QWEN}"])


def test_with_data_or_planning_only_the_run_goes_on_to_resolve_the_model(offline, tmp_path):
    for extra in (["data.train_files=data/math/train.parquet"], ["mlmt.plan_only=true"]):
        with pytest.raises(ModelPathError, match="looks like a Hugging Face hub name"):
            _prepare([f"actor_rollout_ref.model.path={QWEN}", *extra])
