"""Resolve a configured model path to a local Hugging Face folder, with one clear message when that is impossible."""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED = "smollm2"


class ModelPathError(FileNotFoundError):
    """A model path that cannot be used; the message names the path and the fix."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def looks_local(path: str) -> bool:
    """A configured model path that names a folder, not a hub repository (``owner/name``)."""
    return path.startswith(("/", ".", "~")) or path.count("/") != 1


def resolve_model_path(path: str, key: str) -> str:
    """``smollm2`` → the converted embedded model; a local folder → itself; a hub name → its downloaded snapshot.

    Args:
        path: the configured value.
        key: the config key it came from (named in errors).
    """
    if path == EMBEDDED:
        from agent_system.models.smollm2 import ensure_smollm2

        return ensure_smollm2()
    expanded = Path(os.path.expanduser(path))
    if expanded.exists():
        if not (expanded / "config.json").is_file():
            if (expanded / "adapter_config.json").is_file():
                raise ModelPathError(
                    f"{key}={path}: a PEFT adapter folder, not a model: give its base model here (training: the "
                    "adapter as the level's model.lora_adapter_path; the evaluator: the adapter, its base with "
                    "--ll-base / --hl-base)"
                )
            raise ModelPathError(f"{key}={path}: the folder has no config.json, so it is not a Hugging Face model")
        return str(expanded)
    if looks_local(path):
        raise ModelPathError(
            f"{key}={path}: no such folder. Point it at a Hugging Face model folder, or use "
            f"{key}={EMBEDDED} for the embedded SmolLM2-135M-Instruct"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError

    try:
        return snapshot_download(path, local_files_only=_offline())
    except GatedRepoError:
        raise ModelPathError(gated_message(path, key)) from None
    except Exception as error:  # noqa: BLE001 - every other hub failure gets the same actionable message
        raise ModelPathError(
            f"{key}={path} looks like a Hugging Face hub name, but it is not in the local cache and the hub could "
            f"not be reached ({type(error).__name__}). Download it on a machine with access "
            f"(`hf download {path} --local-dir DIR`) and set {key}=DIR, or use {key}={EMBEDDED}"
        ) from None


def gated_message(path: str, key: str) -> str:
    """What to do when the hub refuses ``path`` because it is gated (the scripts' default,
    meta-llama/Llama-3.2-1B-Instruct, is): accept its licence, then give the hub a token of the account that did."""
    return (
        f"{key}={path} is a gated Hugging Face repository: accept its licence on https://huggingface.co/{path} (logged "
        "in to the hub), then set HF_TOKEN to a read token of that account (or log in with `hf auth login`) and "
        "rerun; with a token set already, its account has not been granted access yet. Or download it where that "
        f"works (`hf download {path} --local-dir DIR`) and set {key}=DIR, or use {key}={EMBEDDED}"
    )
