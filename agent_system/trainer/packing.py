"""Training rows from sampled token ids: left-padded prompts, right-padded responses, as verl's actor expects.

Rows are built from exactly the token ids the rollout server returned (never decoded and re-encoded), with the
server's sampling log-probs kept alongside (``rollout_log_probs``) for diagnostics.
"""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto

from agent_system import verl_compat as vc


def padding_id(tokenizer) -> int:
    """The id used to pad rows: the tokenizer's pad token, else its eos (Llama-3.x ships no pad token).

    Padding is masked out everywhere, so the choice never changes what a model sees or learns.
    """
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id[0] if isinstance(token_id, list) else token_id)
    raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token: set one")


def build_rows(
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_token_id: int,
    rollout_log_probs: list[list[float]] | None = None,
    non_tensors: dict[str, list] | None = None,
) -> DataProto:
    """Pack token-id lists into a ``DataProto``.

    Args:
        prompts: prompt token ids per row.
        responses: response token ids per row; an empty one (the server sampled no token) becomes one placeholder
            token, ``pad_token_id``, attended but masked out of ``response_mask`` (verl's padding-free rows need a
            response token), so it is in no loss, gradient, reward position or count.
        pad_token_id: id used for padding (masked out everywhere).
        rollout_log_probs: the server's log-prob of each response token, optional.
        non_tensors: extra per-row fields (lists of equal length), stored as numpy object arrays.

    Returns:
        DataProto with ``prompts`` (B, P), ``responses`` (B, R), ``input_ids`` / ``attention_mask`` /
        ``position_ids`` (B, P+R), ``response_mask`` (B, R) and optionally ``rollout_log_probs`` (B, R).
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"build_rows: {len(prompts)} prompts and {len(responses)} responses")
    width_p = max(len(p) for p in prompts)
    width_r = max(max(len(r) for r in responses), 1)
    batch = len(prompts)
    prompt_ids = torch.full((batch, width_p), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, width_p), dtype=torch.long)
    response_ids = torch.full((batch, width_r), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((batch, width_r), dtype=torch.long)
    response_mask = torch.zeros((batch, width_r), dtype=torch.long)
    log_probs = torch.zeros((batch, width_r), dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, width_p - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[i, width_p - len(prompt) :] = 1
        tokens = response or [pad_token_id]
        response_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_attention[i, : len(tokens)] = 1
        response_mask[i, : len(response)] = 1
        if rollout_log_probs is not None:
            log_probs[i, : len(response)] = torch.tensor(rollout_log_probs[i], dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)  # (B, P+R)
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": vc.compute_position_id_with_mask(attention_mask),
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = log_probs
    arrays = {key: np.array(values, dtype=object) for key, values in (non_tensors or {}).items()}
    return DataProto.from_dict(tensors=tensors, non_tensors=arrays)
