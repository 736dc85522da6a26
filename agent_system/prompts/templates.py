"""Prompt templates of the three MLMT turns (one place; override any of them with ``mlmt.prompts.overrides.<name>``).

* ``solve`` (turn 1, LL): step-by-step work and a final ``\\boxed{}`` answer.
* ``feedback`` (turn 2, HL): a tutor names mistakes and gives hints, does not solve; never sees the ground truth.
* ``refine`` (turn 3, LL): problem + attempt + feedback, asks for a corrected solution.
* ``refine_no_feedback``: the turn-3 prompt with no feedback (reference refinement of the contrastive HL reward).

Each is a single user message, wrapped by the receiving model's own chat template. Over-long quoted attempts and
feedback are shortened in the middle (never right-truncated, so the instruction at the end survives) and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

TEMPLATES = {
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
ELISION = "\n[... {n} characters omitted ...]\n"


@dataclass
class PromptBuilder:
    """Builds turn prompts from the templates, with optional overrides and a character budget for quotes."""

    overrides: dict
    max_quote_chars: int

    def template(self, name: str) -> str:
        if name not in TEMPLATES:
            raise KeyError(f"unknown prompt template {name!r}; known: {sorted(TEMPLATES)}")
        return self.overrides.get(name) or TEMPLATES[name]

    def shorten(self, text: str) -> tuple[str, bool]:
        """Keep the head and the tail of an over-long quote (the final answer is usually at the end)."""
        if len(text) <= self.max_quote_chars:
            return text, False
        keep = max(self.max_quote_chars // 2, 1)
        omitted = len(text) - 2 * keep
        return text[:keep] + ELISION.format(n=omitted) + text[len(text) - keep :], True

    def solve(self, problem: str) -> str:
        return self.template("solve").format(problem=problem)

    def feedback(self, problem: str, attempt: str) -> tuple[str, bool]:
        attempt, shortened = self.shorten(attempt)
        return self.template("feedback").format(problem=problem, attempt=attempt), shortened

    def refine(self, problem: str, attempt: str, feedback: str | None) -> tuple[str, bool]:
        attempt, cut_a = self.shorten(attempt)
        if feedback is None:
            return self.template("refine_no_feedback").format(problem=problem, attempt=attempt), cut_a
        feedback, cut_f = self.shorten(feedback)
        return self.template("refine").format(problem=problem, attempt=attempt, feedback=feedback), cut_a or cut_f


def encode_prompt(tokenizer, text: str, max_tokens: int, what: str) -> list[int]:
    """Chat-template one user message and tokenize it; a prompt over budget is an error, never right-truncated."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    if len(ids) > max_tokens:
        raise PromptTooLongError(
            f"{what} prompt has {len(ids)} tokens, over data.max_prompt_length={max_tokens}; raise it or lower "
            "mlmt.prompts.max_attempt_chars (quoted attempts/feedback are shortened to that many characters)"
        )
    return list(ids)


class PromptTooLongError(ValueError):
    """A turn prompt does not fit in the prompt budget even after shortening its quotes."""
