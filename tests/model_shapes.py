"""Model folders that hold only a config.json, for the start-up checks that read a model's shape (nothing is
downloaded): Llama-3.2-1B's public values and a tiny model of the same family."""

from __future__ import annotations

import json
from pathlib import Path

LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
TINY = {**LLAMA_1B, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000}


def model_folder(folder: Path, shape: dict) -> str:
    """``folder`` created with ``shape`` as its config.json; its path."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(shape))
    return str(folder)
