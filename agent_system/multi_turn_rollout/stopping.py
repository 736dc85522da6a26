"""Which token ids end a response and which id pads it: read from the tokenizer and the model's generation config,
the same for every rollout backend (the hf server, vLLM) and for the episode that judges truncation."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def stop_tokens(model_path: str, tokenizer: Any) -> tuple[list[int], int]:
    """Ids that end a response (the tokenizer's eos and the model's generation_config eos) and the padding id."""
    from transformers import GenerationConfig

    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        generation_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        eos |= set(generation_eos if isinstance(generation_eos, list) else [generation_eos]) - {None}
    except OSError:
        logger.debug("no generation_config.json in %s", model_path)
    if not eos:
        raise ValueError(f"the tokenizer of {model_path} has no eos token; generation could not stop")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    return sorted(eos), pad
