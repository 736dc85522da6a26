"""Optional LLM judge of answer equivalence through an OpenAI-compatible chat endpoint.

Configured from the environment (secrets never go into files)::

    MLMT_JUDGE_BASE_URL=http://host:8000/v1  MLMT_JUDGE_MODEL=qwen2.5-7b-instruct  MLMT_JUDGE_API_KEY=...

It is consulted only when the rule-based verdict is negative; any HTTP error, timeout or unreadable
reply returns None and the caller keeps the rule verdict.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import httpx

logger = logging.getLogger(__name__)

_SYSTEM_PROMPT = (
    "You check whether a student's final answer to a math problem is mathematically equivalent to the "
    "reference answer. Ignore formatting, units written out, and equivalent forms. Reply with exactly one "
    "word: YES or NO."
)


@dataclass(frozen=True)
class JudgeConfig:
    """Where and how to reach the judge.

    Attributes:
        base_url: Base URL of the OpenAI-compatible API (``.../v1``); ``/chat/completions`` is appended.
        model: Model name sent in the request.
        api_key: Bearer token (not shown in ``repr``).
        timeout_s: Total time allowed per request.
    """

    base_url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_s: float = 10.0

    @classmethod
    def from_env(cls, timeout_s: float = 10.0) -> JudgeConfig | None:
        """Builds a config from MLMT_JUDGE_BASE_URL / MLMT_JUDGE_MODEL / MLMT_JUDGE_API_KEY.

        Returns:
            None unless both the base URL and the model are set (the judge is off by default).
        """
        base_url, model = os.environ.get("MLMT_JUDGE_BASE_URL"), os.environ.get("MLMT_JUDGE_MODEL")
        if not base_url or not model:
            return None
        return cls(base_url, model, os.environ.get("MLMT_JUDGE_API_KEY", ""), timeout_s)


def judge_equivalence(problem: str, gold: str, pred: str, config: JudgeConfig) -> bool | None:
    """Asks the judge whether ``pred`` is equivalent to ``gold``.

    Args:
        problem: The problem text (may be empty).
        gold: The reference answer.
        pred: The extracted answer of the response.
        config: Endpoint settings.

    Returns:
        True / False from a YES / NO reply, or None on any failure (error, timeout, other reply).
    """
    user = f"Problem:\n{problem}\n\nReference answer: {gold}\nStudent answer: {pred}\n\nEquivalent?"
    body = {
        "model": config.model,
        "messages": [{"role": "system", "content": _SYSTEM_PROMPT}, {"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": 4,
    }
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    url = config.base_url.rstrip("/") + "/chat/completions"
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=config.timeout_s)
        response.raise_for_status()
        reply = response.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        logger.warning("judge request failed (%s); keeping the rule-based verdict", type(exc).__name__)
        return None
    word = str(reply).strip().strip(".").upper()
    if word.startswith("YES"):
        return True
    if word.startswith("NO"):
        return False
    logger.warning("judge reply %.40r is neither YES nor NO; keeping the rule-based verdict", reply)
    return None
