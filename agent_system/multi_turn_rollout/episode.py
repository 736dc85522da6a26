"""The solve → feedback → refine episode over the LL and HL rollout servers, with per-sample concurrency.

Every attempt is its own asyncio task: as soon as an attempt returns, its m feedbacks start; as soon as a feedback
returns, its refinement starts. Attempts, feedbacks and refinements of different problems therefore overlap
instead of waiting for a turn-wide barrier. Text is decoded only to build the next prompt (HL and LL may use
different tokenizers); training rows keep the exact token ids and log-probs the servers returned. Prompts are chosen
by the task's kind and fit the prompt budget (:mod:`agent_system.prompts.templates`). A code attempt is run against
the tests its task shows in the sandbox before its feedbacks start: the feedback writer reads the execution result
(never a hidden test's, unless ``mlmt.code_feedback_tests=all``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from agent_system.multi_turn_rollout.stopping import stop_tokens
from agent_system.prompts.templates import Prompt, PromptBuilder, Task
from agent_system.rewards.code_sandbox import SandboxLimits

logger = logging.getLogger(__name__)


@dataclass
class Turn:
    """One generated turn: its prompt (text and token ids), response token ids, the server's log-probs, decoded text."""

    prompt: Prompt
    response_ids: list[int]
    log_probs: list[float]
    text: str
    truncated: bool  # used its whole max_tokens budget without emitting a stop token

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.ids

    @property
    def shortened(self) -> bool:
        """A quoted attempt / feedback / execution result in the prompt was shortened to fit the budget."""
        return self.prompt.shortened


@dataclass
class Refinement:
    feedback: Turn | None  # None: self-correction (mlmt.feedback=self), no feedback turn
    refinement: Turn


@dataclass
class Attempt:
    attempt: Turn
    refinements: list[Refinement] = field(default_factory=list)
    no_feedback_refinement: Turn | None = None  # reference refinement for the contrastive HL reward
    execution: str = ""  # code tasks: the attempt's run against the tests, as the feedback writer read it


@dataclass
class Episode:
    problem_index: int
    task: Task
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


def turn_from_output(prompt: Prompt, output: Any, tokenizer: Any, max_tokens: int, stop_ids: set[int]) -> Turn:
    """A :class:`Turn` from a rollout server's output: the sampled token ids and log-probs kept, text decoded."""
    response_ids = list(output.token_ids)
    return Turn(
        prompt=prompt,
        response_ids=response_ids,
        log_probs=list(output.log_probs or []),
        text=tokenizer.decode(response_ids, skip_special_tokens=True),
        truncated=is_truncated(response_ids, max_tokens, stop_ids),
    )


class EpisodeRunner:
    """Runs episodes for a batch of tasks on two policies (anything with an async ``generate``).

    Args:
        ll, hl: The solver's and the feedback writer's policies.
        ll_tokenizer, hl_tokenizer: Their tokenizers (each prompt is built and budgeted with its reader's).
        prompts: The prompt builder.
        sandbox_limits: Limits of the sandbox run that gives a code attempt's execution result to the feedback
            writer (the reward's machinery, :func:`agent_system.rewards.code_reward.execution_result`).
        feedback_tests: Which tests' results the feedback writer reads (``mlmt.code_feedback_tests``): ``"shown"``
            (default) only those the problem statement shows; ``"all"`` every test, hidden ones with their expected
            values, as the original did (a leak of the ground truth to the HL).
    """

    def __init__(
        self,
        ll: Any,
        hl: Any,
        ll_tokenizer: Any,
        hl_tokenizer: Any,
        prompts: PromptBuilder,
        sandbox_limits: SandboxLimits | None = None,
        feedback_tests: str = "shown",
    ) -> None:
        self.ll, self.hl = ll, hl
        self.ll_tokenizer, self.hl_tokenizer = ll_tokenizer, hl_tokenizer
        self.prompts = prompts
        self.sandbox_limits = sandbox_limits or SandboxLimits()
        self.feedback_tests = feedback_tests
        self.stop_ids = {
            id(tokenizer): set(stop_tokens(tokenizer.name_or_path, tokenizer)[0])
            for tokenizer in (ll_tokenizer, hl_tokenizer)
        }

    async def _generate(self, level: str, prompt: Prompt, s: EpisodeSettings, request_id: str) -> Turn:
        policy, tokenizer = (self.ll, self.ll_tokenizer) if level == "ll" else (self.hl, self.hl_tokenizer)
        max_tokens = s.ll_max_tokens if level == "ll" else s.hl_max_tokens
        temperature = s.ll_temperature if level == "ll" else s.hl_temperature
        output = await policy.generate(prompt.ids, max_tokens, temperature, request_id)
        return turn_from_output(prompt, output, tokenizer, max_tokens, self.stop_ids[id(tokenizer)])

    async def solve(self, task: Task, s: EpisodeSettings, request_id: str) -> Turn:
        """Turn 1: the solver's attempt."""
        prompt = self.prompts.solve(task, self.ll_tokenizer, s.max_prompt_tokens)
        return await self._generate("ll", prompt, s, request_id)

    async def execution_result(self, task: Task, attempt: Turn) -> str:
        """Code tasks: ``attempt`` run against the tests the task shows (all its tests with ``feedback_tests="all"``)
        in the sandbox (in a thread: the episodes of other problems go on generating meanwhile), as the feedback writer
        reads it; math tasks: ``""``. Never raises: one model output must not end the training step, so a failure of
        the grader itself becomes an execution result that says so (and a warning in the log)."""
        if task.kind != "code":
            return ""
        from agent_system.rewards.code_reward import execution_result

        args = (
            attempt.text,
            task.ground_truth,
            task.extra_info,
            self.sandbox_limits,
            self.feedback_tests,
            task.problem,
        )
        try:
            return await asyncio.to_thread(execution_result, *args)
        except Exception as exc:
            logger.warning("execution result: the grader failed on an attempt", exc_info=True)
            return f"The grader failed to run this program ({type(exc).__name__}); there is no execution result."

    async def feedback_and_refine(
        self, task: Task, attempt: Turn, execution: str, s: EpisodeSettings, rid: str
    ) -> Refinement:
        """One HL feedback on `attempt` (with its `execution` result for code), then the LL refinement that reads it."""
        prompt = self.prompts.feedback(task, attempt.text, execution, self.hl_tokenizer, s.max_prompt_tokens)
        feedback = await self._generate("hl", prompt, s, f"{rid}/t2")
        prompt = self.prompts.refine(task, attempt.text, feedback.text, self.ll_tokenizer, s.max_prompt_tokens)
        refinement = await self._generate("ll", prompt, s, f"{rid}/t3")
        return Refinement(feedback, refinement)

    async def refine_without_feedback(self, task: Task, attempt: Turn, s: EpisodeSettings, rid: str) -> Turn:
        """The solver refines `attempt` under the fixed self-correction instruction (no feedback writer)."""
        prompt = self.prompts.refine(task, attempt.text, None, self.ll_tokenizer, s.max_prompt_tokens)
        return await self._generate("ll", prompt, s, rid)

    async def _attempt(self, index: int, task: Task, j: int, s: EpisodeSettings, round_id: str) -> Attempt:
        rid = f"{round_id}/p{index}/a{j}"
        attempt = await self.solve(task, s, f"{rid}/t1")
        if s.feedback == "none":
            return Attempt(attempt)
        if s.feedback == "self":
            jobs = [self.refine_without_feedback(task, attempt, s, f"{rid}/s{k}") for k in range(s.m)]
            return Attempt(attempt, [Refinement(None, turn) for turn in await asyncio.gather(*jobs)])
        execution = await self.execution_result(task, attempt)  # once for the m feedbacks
        jobs = [self.feedback_and_refine(task, attempt, execution, s, f"{rid}/f{k}") for k in range(s.m)]
        if s.with_reference_refinement:
            jobs.append(self.refine_without_feedback(task, attempt, s, f"{rid}/ref"))
        results = await asyncio.gather(*jobs)
        reference = results[s.m] if s.with_reference_refinement else None
        return Attempt(attempt, list(results[: s.m]), reference, execution)

    async def run(self, tasks: list[Task], settings: EpisodeSettings, round_id: str) -> list[Episode]:
        """All episodes of the batch; each task gets ``n`` attempts, each attempt ``m`` feedback/refinements
        (``m`` self-corrections with ``feedback="self"``, none with ``feedback="none"``). ``round_id`` names this
        batch's rollout within the run (the step, a validation batch); every request id starts with it."""

        async def episode(i: int, task: Task) -> Episode:
            jobs = [self._attempt(i, task, j, settings, round_id) for j in range(settings.n)]
            attempts = await asyncio.gather(*jobs)
            return Episode(i, task, list(attempts))

        return list(await asyncio.gather(*[episode(i, task) for i, task in enumerate(tasks)]))
