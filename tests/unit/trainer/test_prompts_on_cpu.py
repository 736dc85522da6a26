"""Turn prompts: content, no ground truth for the HL, overrides, middle-shortening of quotes, token budget."""

import pytest

from agent_system.prompts.templates import TEMPLATES, PromptBuilder, PromptTooLongError, encode_prompt

PROBLEM = "Sam has 17 apples and buys 25 more. How many apples does Sam have?"
ANSWER = "42"  # the ground truth of PROBLEM; it must never reach the HL
ATTEMPT = "Sam has 17 apples. 17 + 25 = 41.\nThe answer is \\boxed{41}."
FEEDBACK = "Recheck the addition of the units digits."


def _builder(max_quote_chars=4000, overrides=None):
    return PromptBuilder(overrides=overrides or {}, max_quote_chars=max_quote_chars)


def _tail(name, last_placeholder):
    """The template's text after its last placeholder, as it appears in a prompt (``{{`` → ``{``)."""
    tail = TEMPLATES[name].split(last_placeholder)[-1].format()
    assert len(tail) > 10
    return tail


def test_solve_prompt_has_problem_and_boxed_instruction():
    prompt = _builder().solve(PROBLEM)
    assert PROBLEM in prompt
    assert "\\boxed{answer}" in prompt
    assert "{" + "problem}" not in prompt


def test_feedback_prompt_quotes_problem_and_attempt_but_not_the_answer():
    prompt, shortened = _builder().feedback(PROBLEM, ATTEMPT)
    assert shortened is False
    assert PROBLEM in prompt and ATTEMPT in prompt
    assert ANSWER not in prompt
    assert prompt.endswith("Feedback:")


def test_refine_prompts_quote_attempt_and_feedback():
    prompt, shortened = _builder().refine(PROBLEM, ATTEMPT, FEEDBACK)
    assert not shortened
    assert PROBLEM in prompt and ATTEMPT in prompt and FEEDBACK in prompt
    assert prompt.endswith("\\boxed{answer}.")
    no_feedback, shortened = _builder().refine(PROBLEM, ATTEMPT, None)
    assert not shortened
    assert PROBLEM in no_feedback and ATTEMPT in no_feedback
    assert FEEDBACK not in no_feedback and "tutor" not in no_feedback
    assert no_feedback.endswith("\\boxed{answer}.")


def test_problem_with_braces_is_inserted_verbatim():
    problem = "Compute \\frac{1}{2} + {x}."
    assert problem in _builder().solve(problem)


def test_override_replaces_one_template():
    builder = _builder(overrides={"solve": "Q: {problem}\nA:"})
    assert builder.solve(PROBLEM) == f"Q: {PROBLEM}\nA:"
    # the others keep their defaults
    assert builder.feedback(PROBLEM, ATTEMPT) == _builder().feedback(PROBLEM, ATTEMPT)


def test_unknown_template_name_raises():
    with pytest.raises(KeyError, match="unknown prompt template"):
        _builder().template("solv")


def test_long_attempt_is_shortened_in_the_middle():
    head, middle, tail = "HEAD-" * 20, "m" * 1000, "-TAIL \\boxed{41}"
    attempt = head + middle + tail
    builder = _builder(max_quote_chars=100)
    prompt, shortened = builder.feedback(PROBLEM, attempt)
    assert shortened is True
    assert attempt not in prompt
    assert attempt[:50] in prompt  # head kept
    assert attempt[-50:] in prompt  # tail kept (the final answer is usually at the end)
    assert f"{len(attempt) - 100} characters omitted" in prompt
    assert "m" * 60 not in prompt
    assert prompt.endswith(_tail("feedback", "{attempt}"))  # the instruction after the quote survives
    assert PROBLEM in prompt


def test_long_feedback_in_refine_is_shortened_and_instruction_survives():
    builder = _builder(max_quote_chars=64)
    long_feedback = "start of feedback " + "x" * 500 + " end of feedback"
    prompt, shortened = builder.refine(PROBLEM, ATTEMPT, long_feedback)
    assert shortened is True
    assert ATTEMPT in prompt  # 57 characters: under the budget, quoted whole
    assert long_feedback[:32] in prompt and long_feedback[-32:] in prompt
    assert long_feedback not in prompt
    assert prompt.endswith(_tail("refine", "{feedback}"))


def test_shorten_exactly_at_budget_is_untouched():
    builder = _builder(max_quote_chars=10)
    assert builder.shorten("0123456789") == ("0123456789", False)
    text, shortened = builder.shorten("0123456789A")
    assert shortened and text.startswith("01234") and text.endswith("6789A")


def test_shorten_with_tiny_budget_drops_the_text():
    text, shortened = _builder(max_quote_chars=1).shorten("secret attempt text")
    assert shortened
    assert "secret attempt text" not in text


# ---------------------------------------------------------------- token budget


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from agent_system.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


def test_encode_prompt_returns_the_chat_templated_ids(tokenizer):
    text = _builder().solve(PROBLEM)
    ids = encode_prompt(tokenizer, text, max_tokens=10_000, what="turn-1")
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    decoded = tokenizer.decode(ids)
    assert decoded.startswith("<|im_start|>user\n")
    assert PROBLEM in decoded
    assert decoded.endswith("<|im_start|>assistant\n")


def test_encode_prompt_budget_is_inclusive_and_over_budget_raises(tokenizer):
    text, _ = _builder().feedback(PROBLEM, ATTEMPT)
    length = len(encode_prompt(tokenizer, text, max_tokens=10_000, what="turn-2"))
    assert len(encode_prompt(tokenizer, text, max_tokens=length, what="turn-2")) == length
    with pytest.raises(PromptTooLongError, match="data.max_prompt_length") as error:
        encode_prompt(tokenizer, text, max_tokens=length - 1, what="turn-2")
    message = str(error.value)
    assert "turn-2" in message and f"{length} tokens" in message and f"max_prompt_length={length - 1}" in message
    assert isinstance(error.value, ValueError)
