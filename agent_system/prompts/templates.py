"""Prompt templates of the three MLMT turns, chosen by the row's data source, with quotes shortened to fit the budget.

Four families, selected by the row's ``data_source`` (its kind, :func:`agent_system.rewards.scoring.task_kind`, or
its own family, :data:`FAMILY_OF_SOURCE`):

* math (``math``, ``math500``, ``gsm8k``, ``arith``): ``solve`` (turn 1: step-by-step work and a final ``\\boxed{}``),
  ``feedback`` (turn 2: a math tutor names mistakes and gives hints, does not solve), ``refine`` (turn 3: problem +
  attempt + feedback) and ``refine_no_feedback`` (turn 3 without feedback: the reference refinement of the
  contrastive HL reward and of the confidence term).
* code (``mbpp``): ``code_solve`` (a Python function in one fenced ```python block), ``code_feedback`` (a programming
  mentor gives guidance and no code, reading the attempt's execution result: how many tests passed and the first
  failing test or the error, from the project's sandbox, as the original did; docs/METHOD.md, "Turns and rewards"),
  ``code_refine`` and ``code_refine_no_feedback``. Which tests the solver sees is the data's choice: an MBPP row's
  problem shows its first test as an example of the function's name and signature (``agent_system.data.sources``).
* arith (``arith``, the embedded arithmetic task): the math family in answer-sized form for one-step sums,
  ``arith_solve`` (the number only, in ``\\boxed{}``), ``arith_feedback`` (one sentence: right or not, and a hint,
  not the answer), ``arith_refine`` and ``arith_refine_no_feedback``. With the math family's step-by-step prompts
  SmolLM2-135M ran past 64 tokens on 71 % of its first attempts and 70 % of its refinements, and a training step of the
  main job had a group with mixed outcomes at the HL about half the time (docs/MEASUREMENTS.md, "The main job"). An
  override of a math template (``solve``, ...) applies to arith rows too unless its ``arith_`` name is overridden.
* yaml (``yaml_task``, a task defined in YAML): ``yaml_solve`` is the row's prompt itself (the task's ``main_prompt``
  and item prompt carry the instruction, as in recurve), ``yaml_feedback`` (a reviewer: what is wrong or missing, no
  answer), ``yaml_refine`` and ``yaml_refine_no_feedback`` (answer again, in the form the task asks for).

The HL never sees the ground truth. Override any template with ``mlmt.prompts.overrides.<name>``; an override may
use the placeholders of the template it replaces (:data:`FIELDS`).

Each prompt is a single user message wrapped by the receiving model's chat template, and it must fit in the prompt
budget (``data.max_prompt_length`` tokens). Quoted texts (the attempt, the feedback, the execution result) that do
not fit are shortened by tokens of the receiving model's tokenizer: their head and tail are kept around an elision
marker, never right-truncated, so the instruction after them survives. The room left by the template and the problem
is shared evenly among the quotes, a short quote leaving what it does not need to the others. A start-up check
(:meth:`PromptBuilder.largest_prompt`) makes sure the budget holds every problem with its templates and at least
``min_quote_tokens`` tokens of each quote.

Chat templates get fixed keyword arguments (``chat_template_kwargs``: the trainer's ``data.apply_chat_template_kwargs``,
the evaluator's ``--chat-template-date``). Llama 3.x templates write a "Today Date" line into every prompt from
``strftime_now`` unless a ``date_string`` is given, so without one the same problem is a different prompt every day;
the default :data:`CHAT_TEMPLATE_DATE` is the date those templates fall back to themselves.
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass, field
from typing import Any

MATH_TEMPLATES = {
    "solve": (
        "Solve the following problem. Think step by step, then give the final answer on its own line as "
        "\\boxed{{answer}}.\n\nProblem: {problem}"
    ),
    "feedback": (
        "You are an expert math tutor. A student attempted the problem below. Point out any mistakes or risky "
        "steps in the attempt and give short, concrete hints. Do not solve the problem and do not state the final "
        "answer.\n\nProblem: {problem}\n\nStudent's attempt:\n{attempt}\n\nFeedback:"
    ),
    "refine": (
        "Problem: {problem}\n\nYour previous attempt:\n{attempt}\n\nFeedback from a tutor:\n{feedback}\n\n"
        "Use the feedback to write a corrected solution. Think step by step, then give the final answer on its own "
        "line as \\boxed{{answer}}."
    ),
    "refine_no_feedback": (
        "Problem: {problem}\n\nYour previous attempt:\n{attempt}\n\n"
        "Check your attempt and write a corrected solution. Think step by step, then give the final answer on its "
        "own line as \\boxed{{answer}}."
    ),
}
CODE_TEMPLATES = {
    "code_solve": (
        "You are an expert Python programmer. Write a Python function for the task below. Reply with the complete "
        "function, and any imports it needs, in a single ```python code block.\n\nTask: {problem}"
    ),
    "code_feedback": (
        "You are an expert programming mentor. A student wrote the code below for the task, and it was run against "
        "the task's tests. Using the execution result, explain what is wrong and give one short guiding instruction "
        "to fix it. Do not write any code and do not give the corrected program.\n\nTask: {problem}\n\n"
        "Student's code:\n{attempt}\n\nExecution result:\n{execution}\n\nFeedback:"
    ),
    "code_refine": (
        "Task: {problem}\n\nYour previous code:\n{attempt}\n\nFeedback from a mentor:\n{feedback}\n\n"
        "Use the feedback to fix your code. Reply with the complete corrected function in a single ```python code "
        "block."
    ),
    "code_refine_no_feedback": (
        "Task: {problem}\n\nYour previous code:\n{attempt}\n\n"
        "Check your code for mistakes and fix them. Reply with the complete corrected function in a single "
        "```python code block."
    ),
}
YAML_TEMPLATES = {  # tasks defined in YAML (agent_system/data/yaml_task.py): the task's own prompt is the instruction
    "yaml_solve": "{problem}",
    "yaml_feedback": (
        "You are an expert reviewer. Someone answered the task below. Point out what is wrong or missing in the "
        "response and give short, concrete hints to improve it. Do not write the answer yourself.\n\n"
        "Task: {problem}\n\nResponse:\n{attempt}\n\nFeedback:"
    ),
    "yaml_refine": (
        "{problem}\n\nYour previous response:\n{attempt}\n\nFeedback from a reviewer:\n{feedback}\n\n"
        "Use the feedback to answer the task again, in the form the task asks for."
    ),
    "yaml_refine_no_feedback": (
        "{problem}\n\nYour previous response:\n{attempt}\n\n"
        "Check your response for mistakes and answer the task again, in the form the task asks for."
    ),
}
ARITH_TEMPLATES = {  # answer-sized math turns for the embedded one-step arithmetic task
    "arith_solve": "{problem} Reply with the number only, as \\boxed{{answer}}.",
    "arith_feedback": (
        "A student answered this question. Say in one sentence whether the answer is right and give a hint. "
        "Do not give the answer.\n\nQuestion: {problem}\n\nStudent's answer: {attempt}\n\nFeedback:"
    ),
    "arith_refine": (
        "{problem}\n\nYour previous answer: {attempt}\n\nA tutor's feedback: {feedback}\n\n"
        "Reply with the corrected number only, as \\boxed{{answer}}."
    ),
    "arith_refine_no_feedback": (
        "{problem}\n\nYour previous answer: {attempt}\n\nCheck it and reply with the corrected number only, as "
        "\\boxed{{answer}}."
    ),
}
TEMPLATES = {**MATH_TEMPLATES, **ARITH_TEMPLATES, **CODE_TEMPLATES, **YAML_TEMPLATES}
FAMILY_OF_SOURCE = {"arith": "arith"}  # data sources with their own family; the others use their kind's
TURNS = ("solve", "feedback", "refine", "refine_no_feedback")
LEVEL_OF_TURN = {"solve": "ll", "feedback": "hl", "refine": "ll", "refine_no_feedback": "ll"}  # who reads the prompt
TURNS_OF_FEEDBACK = {  # the turns an episode renders under each ``mlmt.feedback`` mode
    "none": ("solve",),
    "self": ("solve", "refine_no_feedback"),
    "model": TURNS,  # refine_no_feedback: the no-feedback reference refinement of the contrastive HL reward
}
QUOTES = ("attempt", "feedback", "execution")  # the texts that are shortened to fit the budget
FIELDS = {  # the placeholders each template (and its override) may use
    "solve": {"problem"},
    "feedback": {"problem", "attempt"},
    "refine": {"problem", "attempt", "feedback"},
    "refine_no_feedback": {"problem", "attempt"},
    "arith_solve": {"problem"},
    "arith_feedback": {"problem", "attempt"},
    "arith_refine": {"problem", "attempt", "feedback"},
    "arith_refine_no_feedback": {"problem", "attempt"},
    "code_solve": {"problem"},
    "code_feedback": {"problem", "attempt", "execution"},
    "code_refine": {"problem", "attempt", "feedback"},
    "code_refine_no_feedback": {"problem", "attempt"},
    "yaml_solve": {"problem"},
    "yaml_feedback": {"problem", "attempt"},
    "yaml_refine": {"problem", "attempt", "feedback"},
    "yaml_refine_no_feedback": {"problem", "attempt"},
}
ELISION = "\n[... {n} tokens omitted ...]\n"
FAMILIES = ("math", "arith", "code", "yaml")
# Llama 3.x chat templates' own fallback date (used when ``strftime_now`` is unavailable): every prompt the same any day
CHAT_TEMPLATE_DATE = "26 Jul 2024"
DEFAULT_CHAT_TEMPLATE_KWARGS = {"date_string": CHAT_TEMPLATE_DATE}

logger = logging.getLogger(__name__)


def template_fields(template: str) -> set[str]:
    """The placeholder names of a template (``{{`` escapes excluded; a positional ``{}`` gives ``""``)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def override_errors(overrides: dict[str, str]) -> list[str]:
    """What is wrong with ``mlmt.prompts.overrides`` (unknown names, placeholders the template does not have)."""
    errors = []
    for name, text in overrides.items():
        if name not in TEMPLATES:
            errors.append(f"mlmt.prompts.overrides.{name}: unknown template; known: {sorted(TEMPLATES)}")
            continue
        try:
            unknown = template_fields(text) - FIELDS[name]
        except ValueError as error:  # an unmatched brace
            errors.append(f"mlmt.prompts.overrides.{name}: not a format string ({error}); write a brace as {{{{")
            continue
        if unknown:
            errors.append(
                f"mlmt.prompts.overrides.{name} uses {sorted(unknown)}; it may use {sorted(FIELDS[name])} (write a "
                "literal brace as {{ or }})"
            )
    return errors


@dataclass(frozen=True)
class Task:
    """A dataset row as the episode needs it: the problem text, its kind, what grades it (the code path runs the
    attempt against ``ground_truth``'s tests for the feedback writer) and its template family (``family``; empty: its
    kind's)."""

    problem: str
    kind: str  # "math" | "code" | "yaml"
    ground_truth: Any = None
    extra_info: dict = field(default_factory=dict)
    family: str = ""  # one of FAMILIES; "" = the kind's

    @property
    def templates(self) -> str:
        """The template family its prompts come from."""
        return self.family or self.kind

    @classmethod
    def from_row(cls, row: dict) -> Task:
        """From a verl-schema row (``data_source``, ``prompt``, ``reward_model``, ``extra_info``).

        Raises:
            ValueError: A missing field, or an unknown ``data_source`` (the message lists the supported ones).
        """
        from agent_system.rewards.scoring import canonical_data_source, task_kind

        try:
            problem = row["prompt"][0]["content"]
            kind = task_kind(row["data_source"])
            family = FAMILY_OF_SOURCE.get(canonical_data_source(row["data_source"]), "")
            ground_truth = row["reward_model"]["ground_truth"]
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(
                f"row {sorted(row) if isinstance(row, dict) else row!r}: needs data_source, prompt[0].content and "
                f"reward_model.ground_truth (missing {error})"
            ) from None
        return cls(problem, kind, ground_truth, dict(row.get("extra_info") or {}), family)


@dataclass(frozen=True)
class Prompt:
    """One turn's prompt: the user message and the chat-templated token ids the model reads."""

    text: str
    ids: list[int]
    omitted_tokens: int = 0  # tokens elided from its quotes to fit the budget

    @property
    def shortened(self) -> bool:
        return self.omitted_tokens > 0


class PromptTooLongError(ValueError):
    """A turn prompt does not fit in the prompt budget even with its quotes elided."""


def chat_ids(tokenizer: Any, text: str, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The token ids of ``text`` as a single user message under the tokenizer's chat template, generation cue added.

    ``template_kwargs`` are the template's variables (e.g. ``date_string``); None: :data:`DEFAULT_CHAT_TEMPLATE_KWARGS`.
    """
    kwargs = DEFAULT_CHAT_TEMPLATE_KWARGS if template_kwargs is None else template_kwargs
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs
    )
    return list(encoded["input_ids"])


def share_tokens(lengths: dict[str, int], room: int) -> dict[str, int]:
    """Split ``room`` tokens among quotes of ``lengths`` tokens: an equal share each, what a quote shorter than its
    share does not need going to the longer ones. Returns the tokens each quote keeps."""
    keep, left = {}, room
    order = sorted(lengths, key=lengths.__getitem__)
    for position, name in enumerate(order):
        keep[name] = min(lengths[name], left // (len(order) - position))
        left -= keep[name]
    return keep


def elide(tokenizer: Any, ids: list[int], keep: int) -> str:
    """The text of ``ids`` with only its first ``ceil(keep/2)`` and last ``floor(keep/2)`` tokens, joined by a marker
    that says how many were left out (the final answer of an attempt is usually at its end)."""
    head = (keep + 1) // 2
    tail = keep - head
    omitted = ELISION.format(n=len(ids) - keep)
    return tokenizer.decode(ids[:head]) + omitted + (tokenizer.decode(ids[len(ids) - tail :]) if tail else "")


class PromptBuilder:
    """Builds each turn's prompt for the receiving model's tokenizer within the prompt budget.

    Args:
        overrides: Replacement templates by name (``mlmt.prompts.overrides``).
        min_quote_tokens: Tokens of each quote the budget must leave room for (checked by :meth:`largest_prompt`).
        chat_template_kwargs: Variables of every chat-template rendering (``data.apply_chat_template_kwargs``);
            None: :data:`DEFAULT_CHAT_TEMPLATE_KWARGS` (a fixed ``date_string``).
    """

    def __init__(
        self,
        overrides: dict[str, str] | None = None,
        min_quote_tokens: int = 64,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.chat_template_kwargs = dict(
            DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs
        )
        if "date_string" not in self.chat_template_kwargs:
            logger.warning(
                "chat-template kwargs %s have no date_string: a Llama-3.x template writes today's date into every "
                "prompt, so prompts change from day to day (set data.apply_chat_template_kwargs.date_string)",
                self.chat_template_kwargs,
            )
        self.overrides = dict(overrides or {})
        errors = override_errors(self.overrides)
        if errors:
            raise ValueError("; ".join(errors))
        if min_quote_tokens < 1:
            raise ValueError(f"min_quote_tokens={min_quote_tokens}: use at least 1")
        self.min_quote_tokens = min_quote_tokens

    @classmethod
    def from_config(cls, config: Any) -> PromptBuilder:
        """The trainer's builder: ``mlmt.prompts`` and verl's ``data.apply_chat_template_kwargs`` (a fixed
        ``date_string`` by default, ``mlmt-configs/mlmt_trainer.yaml``)."""
        kwargs = config.data.get("apply_chat_template_kwargs")
        return cls(
            dict(config.mlmt.prompts.overrides),
            config.mlmt.prompts.min_quote_tokens,
            {} if kwargs is None else dict(kwargs),
        )

    def template(self, name: str) -> str:
        """Template ``name``: its override, else (an ``arith_`` template) the math template's override, else the
        default."""
        if name not in TEMPLATES:
            raise KeyError(f"unknown prompt template {name!r}; known: {sorted(TEMPLATES)}")
        math_name = name.removeprefix("arith_")
        return self.overrides.get(name) or self.overrides.get(math_name) or TEMPLATES[name]

    @staticmethod
    def name(turn: str, family: str) -> str:
        """The template of ``turn`` (one of :data:`TURNS`) for a task of template ``family`` (:data:`FAMILIES`)."""
        if turn not in TURNS or family not in FAMILIES:
            raise ValueError(f"no template for turn {turn!r} of a {family!r} task; turns {TURNS}, families {FAMILIES}")
        return turn if family == "math" else f"{family}_{turn}"

    def solve(self, task: Task, tokenizer: Any, budget: int) -> Prompt:
        """Turn 1 (LL)."""
        return self.build(self.name("solve", task.templates), tokenizer, budget, task.problem, {})

    def feedback(self, task: Task, attempt: str, execution: str, tokenizer: Any, budget: int) -> Prompt:
        """Turn 2 (HL): the problem, the attempt and, for code, its execution result."""
        quotes = {"attempt": attempt, "execution": execution}
        return self.build(self.name("feedback", task.templates), tokenizer, budget, task.problem, quotes)

    def refine(self, task: Task, attempt: str, feedback: str | None, tokenizer: Any, budget: int) -> Prompt:
        """Turn 3 (LL): the problem, the attempt and the feedback; ``feedback=None``: the no-feedback refinement."""
        if feedback is None:
            name = self.name("refine_no_feedback", task.templates)
            return self.build(name, tokenizer, budget, task.problem, {"attempt": attempt})
        quotes = {"attempt": attempt, "feedback": feedback}
        return self.build(self.name("refine", task.templates), tokenizer, budget, task.problem, quotes)

    def build(self, name: str, tokenizer: Any, budget: int, problem: str, quotes: dict[str, str]) -> Prompt:
        """Template ``name`` with ``problem`` and ``quotes``, the quotes shortened by tokens until it fits ``budget``.

        Raises:
            PromptTooLongError: The template and the problem alone exceed the budget.
        """
        template = self.template(name)
        used = template_fields(template)
        quotes = {key: value for key, value in quotes.items() if key in used}

        def render(values: dict[str, str]) -> str:
            return template.format(problem=problem, **values)

        text = render(quotes)
        ids = chat_ids(tokenizer, text, self.chat_template_kwargs)
        if len(ids) <= budget:
            return Prompt(text, ids)
        quote_ids = {key: tokenizer.encode(value, add_special_tokens=False) for key, value in quotes.items()}
        lengths = {key: len(value) for key, value in quote_ids.items()}
        marker = ELISION.format(n=max(lengths.values(), default=0))
        floor = (
            len(chat_ids(tokenizer, render({key: marker for key in quotes}), self.chat_template_kwargs))
            if quotes
            else len(ids)
        )
        room = budget - floor
        while quotes and room >= 0:
            keep = share_tokens(lengths, room)
            cut = [key for key in quotes if keep[key] < lengths[key]]
            text = render({k: elide(tokenizer, quote_ids[k], keep[k]) if k in cut else quotes[k] for k in quotes})
            ids = chat_ids(tokenizer, text, self.chat_template_kwargs)
            if len(ids) <= budget:
                return Prompt(text, ids, sum(lengths[key] - keep[key] for key in cut))
            room -= len(ids) - budget  # re-tokenising at the cut points can cost a few more tokens
        raise PromptTooLongError(
            f"the {name} prompt needs {floor} tokens{' with its quotes elided' if quotes else ''}, over "
            f"data.max_prompt_length={budget}: the template and the problem alone do not fit; raise "
            f"data.max_prompt_length or shorten the template (mlmt.prompts.overrides.{name})"
        )

    def required_tokens(self, name: str, tokenizer: Any, problem: str) -> int:
        """Tokens template ``name`` needs for ``problem`` with each of its quotes shortened to ``min_quote_tokens``."""
        template = self.template(name)
        quotes = [key for key in QUOTES if key in template_fields(template)]
        marker = ELISION.format(n=99999)
        prompt = template.format(problem=problem, **{key: marker for key in quotes})
        fixed = len(chat_ids(tokenizer, prompt, self.chat_template_kwargs))
        return fixed + len(quotes) * self.min_quote_tokens

    def largest_prompt(
        self, tasks: list[Task], tokenizers: dict[str, Any], turns: tuple[str, ...] = TURNS, candidates: int = 8
    ) -> tuple[int, str, int]:
        """The largest prompt any of ``tasks`` needs (:meth:`required_tokens`): ``(tokens, template name, index)``.

        ``tokenizers`` maps a level (``ll``, ``hl``) to its tokenizer; each template is measured with the tokenizer of
        the model that reads it. Only the templates of ``turns`` (the ones the run renders, :data:`TURNS_OF_FEEDBACK`)
        are measured, and only the ``candidates`` longest problems of each family (by their own token count): a template
        adds the same text to every problem.
        """
        worst = (0, "", -1)
        for family in FAMILIES:
            indices = [i for i, task in enumerate(tasks) if task.templates == family]
            if not indices:
                continue
            for level, tokenizer in tokenizers.items():
                lengths = tokenizer([tasks[i].problem for i in indices], add_special_tokens=False)["input_ids"]
                longest = sorted(range(len(indices)), key=lambda j: len(lengths[j]), reverse=True)[:candidates]
                for turn in (t for t in turns if LEVEL_OF_TURN[t] == level):
                    name = self.name(turn, family)
                    for j in longest:
                        tokens = self.required_tokens(name, tokenizer, tasks[indices[j]].problem)
                        worst = max(worst, (tokens, name, indices[j]))
        return worst
