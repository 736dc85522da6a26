"""The solve → feedback → refine episode over the LL and HL rollout servers, with per-sample concurrency.

Every attempt is its own asyncio task: as soon as an attempt returns, its m feedbacks start; as soon as a feedback
returns, its refinement starts. Attempts, feedbacks and refinements of different problems therefore overlap
instead of waiting for a turn-wide barrier. Text is decoded only to build the next prompt (HL and LL may use
different tokenizers); training rows keep the exact token ids and log-probs the servers returned.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agent_system.prompts.templates import PromptBuilder, encode_prompt


@dataclass
class Turn:
    """One generated turn: prompt and response token ids, the server's log-probs, decoded text."""

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    text: str
    truncated: bool  # used its whole max_tokens budget without emitting a stop token
    shortened: bool = False  # a quoted attempt/feedback in its prompt was shortened


@dataclass
class Refinement:
    feedback: Turn | None  # None: self-correction (mlmt.feedback=self), no feedback turn
    refinement: Turn


@dataclass
class Attempt:
    attempt: Turn
    refinements: list[Refinement] = field(default_factory=list)
    no_feedback_refinement: Turn | None = None  # reference refinement for the contrastive HL reward


@dataclass
class Episode:
    problem_index: int
    problem: str
    attempts: list[Attempt]


@dataclass
class EpisodeSettings:
    n: int  # attempts per problem
    m: int  # feedbacks per attempt
    ll_max_tokens: int
    hl_max_tokens: int
    max_prompt_tokens: int
    ll_temperature: float
    hl_temperature: float
    with_reference_refinement: bool = False
    feedback: str = "model"  # model: HL feedback then refinement | self: refinement alone (SCoRe) | none: turn 1 only


def is_truncated(response_ids: list[int], max_tokens: int, stop_ids: set[int]) -> bool:
    """A response was cut by its budget when it used every allowed token and the last is not a stop token.

    Derived from the tokens, not from a ``finish_reason``: verl's vLLM server does not report one.
    """
    return len(response_ids) >= max_tokens and (not response_ids or response_ids[-1] not in stop_ids)


def turn_from_output(
    prompt_ids: list[int], output: Any, tokenizer: Any, max_tokens: int, stop_ids: set[int], shortened: bool = False
) -> Turn:
    """A :class:`Turn` from a rollout server's output: the sampled token ids and log-probs kept, text decoded."""
    response_ids = list(output.token_ids)
    return Turn(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        log_probs=list(output.log_probs or []),
        text=tokenizer.decode(response_ids, skip_special_tokens=True),
        truncated=is_truncated(response_ids, max_tokens, stop_ids),
        shortened=shortened,
    )


class EpisodeRunner:
    """Runs episodes for a batch of problems on two policies (anything with an async ``generate``)."""

    def __init__(self, ll: Any, hl: Any, ll_tokenizer: Any, hl_tokenizer: Any, prompts: PromptBuilder) -> None:
        from agent_system.cpu_backend.hf_server import stop_tokens

        self.ll, self.hl = ll, hl
        self.ll_tokenizer, self.hl_tokenizer = ll_tokenizer, hl_tokenizer
        self.prompts = prompts
        self.stop_ids = {
            id(tokenizer): set(stop_tokens(tokenizer.name_or_path, tokenizer)[0])
            for tokenizer in (ll_tokenizer, hl_tokenizer)
        }

    async def _turn(self, policy, tokenizer, text, max_tokens, temperature, max_prompt, what, request_id, shortened):
        prompt_ids = encode_prompt(tokenizer, text, max_prompt, what)
        output = await policy.generate(prompt_ids, max_tokens, temperature, request_id)
        return turn_from_output(prompt_ids, output, tokenizer, max_tokens, self.stop_ids[id(tokenizer)], shortened)

    async def _ll(self, text: str, s: EpisodeSettings, what: str, request_id: str, shortened: bool) -> Turn:
        return await self._turn(
            self.ll,
            self.ll_tokenizer,
            text,
            s.ll_max_tokens,
            s.ll_temperature,
            s.max_prompt_tokens,
            what,
            request_id,
            shortened,
        )

    async def _hl(self, text: str, s: EpisodeSettings, what: str, request_id: str, shortened: bool) -> Turn:
        return await self._turn(
            self.hl,
            self.hl_tokenizer,
            text,
            s.hl_max_tokens,
            s.hl_temperature,
            s.max_prompt_tokens,
            what,
            request_id,
            shortened,
        )

    async def solve(self, problem: str, s: EpisodeSettings, request_id: str) -> Turn:
        """Turn 1: the solver's attempt."""
        return await self._ll(self.prompts.solve(problem), s, "turn-1 (solve)", request_id, False)

    async def feedback_and_refine(self, problem: str, attempt: Turn, s: EpisodeSettings, rid: str) -> Refinement:
        """One HL feedback on `attempt`, then the LL refinement that reads it."""
        text, cut = self.prompts.feedback(problem, attempt.text)
        feedback = await self._hl(text, s, "turn-2 (feedback)", f"{rid}/t2", cut)
        text, cut = self.prompts.refine(problem, attempt.text, feedback.text)
        refinement = await self._ll(text, s, "turn-3 (refine)", f"{rid}/t3", cut)
        return Refinement(feedback, refinement)

    async def refine_without_feedback(self, problem: str, attempt: Turn, s: EpisodeSettings, rid: str) -> Turn:
        """The solver refines `attempt` under the fixed self-correction instruction (no feedback writer)."""
        text, cut = self.prompts.refine(problem, attempt.text, None)
        return await self._ll(text, s, "turn-3 (no feedback)", rid, cut)

    async def _attempt(self, index: int, problem: str, j: int, s: EpisodeSettings) -> Attempt:
        rid = f"p{index}/a{j}"
        attempt = await self.solve(problem, s, f"{rid}/t1")
        if s.feedback == "none":
            return Attempt(attempt)
        if s.feedback == "self":
            jobs = [self.refine_without_feedback(problem, attempt, s, f"{rid}/s{k}") for k in range(s.m)]
            return Attempt(attempt, [Refinement(None, turn) for turn in await asyncio.gather(*jobs)])
        jobs = [self.feedback_and_refine(problem, attempt, s, f"{rid}/f{k}") for k in range(s.m)]
        if s.with_reference_refinement:
            jobs.append(self.refine_without_feedback(problem, attempt, s, f"{rid}/ref"))
        results = await asyncio.gather(*jobs)
        reference = results[s.m] if s.with_reference_refinement else None
        return Attempt(attempt, list(results[: s.m]), reference)

    async def run(self, problems: list[str], settings: EpisodeSettings) -> list[Episode]:
        """All episodes of the batch; each problem gets ``n`` attempts, each attempt ``m`` feedback/refinements
        (``m`` self-corrections with ``feedback="self"``, none with ``feedback="none"``)."""

        async def episode(i: int, problem: str) -> Episode:
            attempts = await asyncio.gather(*[self._attempt(i, problem, j, settings) for j in range(settings.n)])
            return Episode(i, problem, list(attempts))

        return list(await asyncio.gather(*[episode(i, p) for i, p in enumerate(problems)]))
