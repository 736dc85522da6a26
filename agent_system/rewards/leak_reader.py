"""The reader test of a feedback (issue 44, docs/LEAK.md "The reader test"): what the solver can read from it.

A feedback leaks, however it is phrased, when it makes the solver's reference model much likelier to answer the gold
at once. Two scoring rows per feedback, both the solver's refine prompt (:meth:`PromptBuilder.refine`, the turn-3
prompt with the problem and the attempt) followed by the answer-forcing prefix :data:`ANSWER_PREFIX`, the response
the gold and :data:`ANSWER_CLOSE`: one with the feedback, one with the fixed :data:`NEUTRAL_FEEDBACK`. The gain is

    log p(gold | problem, attempt, feedback) − log p(gold | problem, attempt, neutral feedback)

in nats (summed over the answer's tokens), and a feedback whose gain is at least the threshold leaks. The prefix is
the one the math and arith templates ask the final answer in (``\\boxed{answer}``); with templates overridden to ask
for another form, the model is forced into an answer it would not write, and the gains measure less.

The trainer scores the rows with the solver's reference model (``agent_system/methods/leak_reader``,
``mlmt.reward.leak_reader``); ``python -m agent_system.rewards.leak --score FILE --reader MODEL`` with a Hugging Face
model on the CPU (:func:`answer_log_probs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agent_system.prompts.templates import PromptBuilder, Task

ANSWER_PREFIX = "\\boxed{"  # after the refine prompt: the next tokens are the answer
ANSWER_CLOSE = "}"  # after the gold: the answer ends there
NEUTRAL_FEEDBACK = "Read the problem again and check each step of your attempt."  # names no value, no method
DEFAULT_THRESHOLD_NATS = 2.0  # mlmt.reward.leak_reader_threshold's default (the gold made 7.4 times likelier)


@dataclass(frozen=True)
class ReaderRows:
    """The token ids of one feedback's two scoring rows: the prompts end with the answer-forcing prefix."""

    with_feedback: list[int]
    neutral: list[int]
    answer: list[int]  # the gold, then the close


def reader_rows(
    prompts: PromptBuilder, task: Task, attempt: str, feedback: str, gold: str, tokenizer: Any, budget: int
) -> ReaderRows:
    """The scoring rows of ``feedback`` on ``task`` (the solver's tokenizer, its prompt budget in tokens).

    Raises:
        ValueError: The gold is empty (nothing to score).
    """
    if not str(gold).strip():
        raise ValueError(f"problem {task.problem[:80]!r}: empty gold, which the reader test scores")
    answer = tokenizer.encode(str(gold) + ANSWER_CLOSE, add_special_tokens=False)
    prefix = tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False)
    with_feedback = prompts.refine(task, attempt, feedback, tokenizer, budget).ids + prefix
    neutral = prompts.refine(task, attempt, NEUTRAL_FEEDBACK, tokenizer, budget).ids + prefix
    return ReaderRows(with_feedback, neutral, answer)


def reader_gains(log_probs_with: np.ndarray, log_probs_neutral: np.ndarray) -> np.ndarray:
    """The gain of each feedback in nats: its answer's summed log-prob with the feedback less with the neutral one."""
    return np.asarray(log_probs_with, dtype=np.float64) - np.asarray(log_probs_neutral, dtype=np.float64)


def reader_verdicts(gains: np.ndarray, threshold: float) -> np.ndarray:
    """1.0 where a gain reaches ``threshold`` nats, 0.0 below, NaN where no gain was measured (not a math row)."""
    gains = np.asarray(gains, dtype=np.float64)
    return np.where(np.isnan(gains), np.nan, (gains >= threshold).astype(np.float64))


@torch.no_grad()
def answer_log_probs(model: Any, prompts: list[list[int]], answers: list[list[int]]) -> np.ndarray:
    """The summed log-prob of each answer after its prompt under a Hugging Face causal LM, one row at a time (CPU)."""
    sums = []
    for prompt, answer in zip(prompts, answers, strict=True):
        ids = torch.tensor([prompt + answer])
        log_probs = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        sums.append(float(log_probs.gather(1, torch.tensor(answer)[:, None]).sum()))
    return np.array(sums)


def hf_gains(model: Any, rows: list[ReaderRows]) -> np.ndarray:
    """:func:`reader_gains` of ``rows`` under a Hugging Face model (:func:`answer_log_probs`)."""
    answers = [row.answer for row in rows]
    with_feedback = answer_log_probs(model, [row.with_feedback for row in rows], answers)
    return reader_gains(with_feedback, answer_log_probs(model, [row.neutral for row in rows], answers))
