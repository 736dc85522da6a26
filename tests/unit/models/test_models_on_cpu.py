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
    assert "hf download someorg/somemodel-mlmt-test" in message


def test_a_gated_hub_repository_says_accept_the_licence_and_set_hf_token(monkeypatch, tmp_path):
    """The scripts' default model is gated: the hub's refusal, raised as huggingface_hub raises it (a 403 whose
    X-Error-Code is GatedRepo, through ``hf_raise_for_status``), names the licence, HF_TOKEN, the key and the repo."""
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError
    from huggingface_hub.utils import hf_raise_for_status

    repo = "meta-llama/Llama-3.2-1B-Instruct"
    url = f"https://huggingface.co/api/models/{repo}/revision/main"
    refusal = httpx.Response(403, headers={"X-Error-Code": "GatedRepo"}, request=httpx.Request("GET", url))

    def snapshot_download(repo_id, **kwargs):
        hf_raise_for_status(refusal)  # what snapshot_download re-raises for a gated repository

    with pytest.raises(GatedRepoError):
        snapshot_download(repo)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)  # so the name is not a local folder
    with pytest.raises(ModelPathError) as error:
        resolve_model_path(repo, KEY)
    message = str(error.value)
    assert f"{KEY}={repo} is a gated Hugging Face repository" in message
    assert f"accept its licence on https://huggingface.co/{repo}" in message
    assert "set HF_TOKEN" in message and "hf auth login" in message
    assert "could not be reached" not in message
