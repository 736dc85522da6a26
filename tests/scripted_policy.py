"""A scripted policy for episode tests: a fixed reply per turn (like nanochat's MockModel), every prompt recorded.

    from scripted_policy import ScriptedPolicy
    ll = ScriptedPolicy(tokenizer, {"t1": "attempt", "t3": "refinement"})

The episode runner calls ``generate`` with request ids ending in ``/t1``, ``/t2``, ``/t3``; the reply is the text of
that turn, tokenized by the level's real tokenizer and cut at ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Output:
    token_ids: list[int]
    log_probs: list[float]


class ScriptedPolicy:
    """Replies to turn ``tN`` (the end of the request id) with ``replies[N]``; records every prompt it was sent, as
    token ids (``prompts``) and as text (``texts``), and every request id (``request_ids``)."""

    def __init__(self, tokenizer, replies: dict[str, str]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.prompts: list[list[int]] = []
        self.texts: list[str] = []
        self.request_ids: list[str] = []

    async def generate(self, prompt_ids, max_tokens, temperature, request_id):
        self.prompts.append(prompt_ids)
        self.texts.append(self.tokenizer.decode(prompt_ids))
        self.request_ids.append(request_id)
        ids = self.tokenizer.encode(self.replies[request_id.rsplit("/", 1)[-1]], add_special_tokens=False)
        return Output(ids[:max_tokens], [-0.5] * min(len(ids), max_tokens))
