"""Model path resolution: local folders, and one clear ModelPathError for everything unusable."""

import json

import pytest

from agent_system.models.resolve import ModelPathError, resolve_model_path

KEY = "actor_rollout_ref.model.path"


def test_local_hf_folder_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert resolve_model_path(str(tmp_path), KEY) == str(tmp_path)


@pytest.mark.parametrize("relative", [False, True])
def test_missing_local_path_names_key_and_path(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)
    path = "./no/such/model" if relative else str(tmp_path / "no" / "such" / "model")
    with pytest.raises(ModelPathError) as error:
        resolve_model_path(path, KEY)
    message = str(error.value)
    assert f"{KEY}={path}" in message
    assert "no such folder" in message
    assert isinstance(error.value, FileNotFoundError)


def test_folder_without_config_json_raises(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelPathError, match="config.json") as error:
        resolve_model_path(str(tmp_path), "hl.model.path")
    assert f"hl.model.path={tmp_path}" in str(error.value)


def test_hub_name_offline_and_not_cached_raises(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # so "someorg/somemodel" is not a local folder
    with pytest.raises(ModelPathError) as error:
        resolve_model_path("someorg/somemodel-mlmt-test", "hl.model.path")
    message = str(error.value)
    assert "hl.model.path=someorg/somemodel-mlmt-test" in message
    assert "hub" in message
    assert "huggingface-cli download someorg/somemodel-mlmt-test" in message
