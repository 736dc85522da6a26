"""Supervised warm-ups of the toy tasks' tiny models (the relay task, :mod:`agent_system.demos.relay`, and the
learning tests' cue task): the exact turn prompts the trainer builds, AdamW (3e-3 unless told), batches of 32, the
model saved in place."""

from __future__ import annotations

import torch


def load(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def fine_tune(path: str, example, steps: int, seed: int, lr: float = 3e-3, decay: bool = False) -> float:
    """Supervised steps (32 (prompt ids, response text) pairs from ``example(tokenizer)`` each) on the model at
    ``path``, saved in place; returns the last step's loss. ``decay``: the lr falls linearly to 0 over the second half
    (a stochastic target then settles instead of swinging with the last batches)."""
    torch.manual_seed(seed)
    tokenizer, model = load(path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    half = steps // 2
    factor = (lambda step: min(1.0, (steps - step) / (steps - half))) if decay else (lambda step: 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    loss = None
    for _ in range(steps):
        ids, mask, labels = _batch(tokenizer, [example(tokenizer) for _ in range(32)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.save_pretrained(path)
    return float(loss.detach())


def response_probabilities(model, tokenizer, prompt: list[int], texts: list[str]) -> list[float]:
    """The model's probability of each response in ``texts`` (then eos) after ``prompt``, in one batch."""
    ids, mask, labels = _batch(tokenizer, [(prompt, text) for text in texts])
    with torch.no_grad():
        logprobs = model(input_ids=ids, attention_mask=mask).logits[:, :-1].log_softmax(-1)
    targets = labels[:, 1:]  # each position's next token, -100 outside the response
    token_logprobs = logprobs.gather(2, targets.clamp(min=0)[..., None])[..., 0]
    return token_logprobs.where(targets != -100, 0.0).sum(1).exp().tolist()


def _batch(tokenizer, pairs: list[tuple[list[int], str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels) of (prompt ids, response text) pairs, each response then eos, right-padded;
    the labels are the response's tokens, -100 elsewhere."""
    rows = [
        (prompt, tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        for prompt, text in pairs
    ]
    ids = torch.full((len(rows), max(len(p) + len(r) for p, r in rows)), tokenizer.pad_token_id)
    labels, mask = torch.full_like(ids, -100), torch.zeros_like(ids)
    for i, (prompt, response) in enumerate(rows):
        row = prompt + response
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        labels[i, len(prompt) : len(row)] = torch.tensor(response)
    return ids, mask, labels
