"""PEFT LoRA adapter folders: recognise one, find its base model, and merge it into the base.

An adapter folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (what
``python -m agent_system.launcher.export`` writes as ``<out>/<level>_adapter``, or any PEFT ``save_pretrained``), and
no ``config.json``. The evaluator runs such a folder as the base model with the adapter merged in
(:func:`merged_model_folder`): merging is exact up to floating-point rounding, and both of its engines (vLLM and the
HF server) then load one ordinary model folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


class AdapterError(FileNotFoundError):
    """An adapter folder that cannot be used; the message names the folder and the fix."""


def is_adapter_folder(path: str) -> bool:
    """True for a folder with ``adapter_config.json`` and no ``config.json`` (a PEFT adapter, not a model)."""
    folder = Path(os.path.expanduser(path))
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def recorded_base(adapter: str) -> str | None:
    """The base model the adapter names (``base_model_name_or_path`` of its ``adapter_config.json``), if any."""
    config = json.loads((Path(os.path.expanduser(adapter)) / ADAPTER_CONFIG).read_text())
    return config.get("base_model_name_or_path") or None


def merge_into(model, adapter: str, out: str, dtype) -> None:
    """Merge ``adapter`` into ``model`` (a float32 ``PreTrainedModel``: PEFT's ``merge_and_unload``) and save the
    result in ``dtype`` to ``out``.

    An adapter on the output layer or the input embeddings of a model that ties them (``tie_word_embeddings``: SmolLM2,
    Qwen2.5 up to 3B, Llama 3.2) acts on that one layer, but merged into the shared weight it would change both: the
    merged model would compute something else than the adapter on its base (logits 18 apart in a tiny model). So the
    two layers are untied for the merge, each with its own copy of the weight, and tied again when the merge left them
    equal (an adapter on neither)."""
    import torch
    from peft import PeftModel

    tied = _untie_embeddings(model)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    if tied:
        inputs, output = merged.get_input_embeddings(), merged.get_output_embeddings()
        if torch.equal(inputs.weight, output.weight):
            output.weight = inputs.weight
            merged.config.tie_word_embeddings = True
        else:
            logger.info("%s adapts a tied embedding: the merged model's output layer is saved untied", adapter)
    merged.to(dtype).save_pretrained(out)


def _untie_embeddings(model) -> bool:
    """Give ``model``'s output layer its own copy of the weight it shares with the input embeddings, if it does;
    returns whether it did."""
    import torch

    inputs, output = model.get_input_embeddings(), model.get_output_embeddings()
    if output is None or output.weight is not inputs.weight:
        return False
    output.weight = torch.nn.Parameter(inputs.weight.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    return True


def _fingerprint(adapter: Path, base: Path) -> str:
    """Identifies a merge: the adapter's config and weights, and the base folder (its path, config and the sizes and
    times of its files)."""
    digest = hashlib.sha256()
    for file in sorted(adapter.iterdir()):
        if file.is_file():
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    digest.update(str(base.resolve()).encode())
    for file in sorted(base.iterdir()):
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def merged_model_folder(adapter: str, base: str, cache: Path) -> str:
    """The base model folder ``base`` with the adapter folder ``adapter`` merged in, written once under ``cache``
    (``merged-<fingerprint>``, an atomic rename) and reused while neither changes; weights in the base's dtype,
    the base's tokenizer and generation config beside them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    adapter_dir, base_dir = Path(os.path.expanduser(adapter)), Path(base)
    target = cache / f"merged-{_fingerprint(adapter_dir, base_dir)}"
    if (target / "config.json").is_file():
        return str(target)
    dtype = getattr(AutoConfig.from_pretrained(base_dir), "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".{target.name}.{os.getpid()}"
    try:
        merge_into(model, str(adapter_dir), str(staging), dtype)
    except (ValueError, RuntimeError, KeyError) as error:  # PEFT's and torch's errors for an adapter of another model
        shutil.rmtree(staging, ignore_errors=True)
        raise AdapterError(
            f"{adapter}: the adapter does not fit the base model {base} ({type(error).__name__}: {error}); give the "
            "base it was trained on"
        ) from None
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(staging)
    if (base_dir / "generation_config.json").is_file():
        GenerationConfig.from_pretrained(base_dir).save_pretrained(staging)
    (staging / "merged_from.json").write_text(
        json.dumps({"adapter": str(adapter_dir.resolve()), "base": str(base_dir.resolve())}, indent=2) + "\n"
    )
    try:
        staging.rename(target)
    except OSError:  # another process merged the same pair first
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("%s merged into %s -> %s", adapter, base, target)
    return str(target)
