"""Turn prompts: content by task kind, no ground truth for the HL, overrides, and quotes shortened by tokens of the
receiving model's tokenizer so that every prompt fits the budget (real byte-level BPE chat tokenizers)."""

import json
import re

import pytest

from agent_system.prompts.templates import (
    ELISION,
    TEMPLATES,
    PromptBuilder,
    PromptTooLongError,
    Task,
    chat_ids,
    override_errors,
    share_tokens,
)

PROBLEM = "Sam has 17 apples and buys 25 more. How many apples does Sam have?"
ANSWER = "42"  # the ground truth of PROBLEM; it must never reach the HL
ATTEMPT = "Sam has 17 apples. 17 + 25 = 41.\nThe answer is \\boxed{41}."
FEEDBACK = "Recheck the addition of the units digits."
MATH = Task(PROBLEM, "math", ANSWER)
BIG = 100_000  # a budget nothing here reaches


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from agent_system.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    """A second tokenizer with another vocabulary (the HL's, when the levels use different models)."""
    from agent_system.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("other_tokenizer"), vocab_size=300, seed=1)


def _tail(name, last_placeholder):
    """The template's text after its last placeholder, as it appears in a prompt (``{{`` → ``{``)."""
    tail = TEMPLATES[name].split(last_placeholder)[-1].format()
    assert len(tail) > 10
    return tail


def _long_attempt(words=3000):
    return "HEAD-OF-ATTEMPT " + " ".join(f"step{i % 97}" for i in range(words)) + " so the answer is \\boxed{41}."


# ---------------------------------------------------------------- math prompts


def test_solve_prompt_has_problem_and_boxed_instruction(tokenizer):
    prompt = PromptBuilder().solve(MATH, tokenizer, BIG)
    assert PROBLEM in prompt.text and "\\boxed{answer}" in prompt.text
    assert "{" + "problem}" not in prompt.text
    assert prompt.ids == chat_ids(tokenizer, prompt.text) and not prompt.shortened
    decoded = tokenizer.decode(prompt.ids)
    assert decoded.startswith("<|im_start|>user\n") and decoded.endswith("<|im_start|>assistant\n")


def test_feedback_prompt_quotes_problem_and_attempt_but_not_the_answer(tokenizer):
    prompt = PromptBuilder().feedback(MATH, ATTEMPT, "", tokenizer, BIG)
    assert not prompt.shortened and prompt.omitted_tokens == 0
    assert PROBLEM in prompt.text and ATTEMPT in prompt.text
    assert ANSWER not in prompt.text
    assert prompt.text.endswith("Feedback:")
    assert "math tutor" in prompt.text and "Execution result" not in prompt.text


def test_refine_prompts_quote_attempt_and_feedback(tokenizer):
    prompt = PromptBuilder().refine(MATH, ATTEMPT, FEEDBACK, tokenizer, BIG)
    assert not prompt.shortened
    assert PROBLEM in prompt.text and ATTEMPT in prompt.text and FEEDBACK in prompt.text
    assert prompt.text.endswith("\\boxed{answer}.")
    no_feedback = PromptBuilder().refine(MATH, ATTEMPT, None, tokenizer, BIG)
    assert PROBLEM in no_feedback.text and ATTEMPT in no_feedback.text
    assert FEEDBACK not in no_feedback.text and "tutor" not in no_feedback.text
    assert no_feedback.text.endswith("\\boxed{answer}.")


def test_problem_with_braces_is_inserted_verbatim(tokenizer):
    problem = "Compute \\frac{1}{2} + {x}."
    assert problem in PromptBuilder().solve(Task(problem, "math"), tokenizer, BIG).text


# ---------------------------------------------------------------- code prompts (selected by data_source)


def _mbpp_row():
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
    return {
        "data_source": "mbpp",
        "prompt": [
            {
                "role": "user",
                "content": "Write a function add(a, b).\n\nYour code should pass this test, among others:\n" + tests[0],
            }
        ],  # fmt: skip
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
        "extra_info": {"index": 0, "entry_point": "add", "test_setup_code": ""},
    }


@pytest.mark.parametrize(("source", "kind"), [("mbpp", "code"), ("mbpp_sanitized", "code"), ("math500", "math")])
def test_task_kind_follows_the_data_source(source, kind):
    assert Task.from_row({**_mbpp_row(), "data_source": source}).kind == kind


def test_unknown_data_source_or_missing_field_is_an_error_naming_it():
    with pytest.raises(ValueError, match="unknown data_source 'humaneval'"):
        Task.from_row({**_mbpp_row(), "data_source": "humaneval"})
    row = _mbpp_row()
    del row["reward_model"]
    with pytest.raises(ValueError, match="reward_model"):
        Task.from_row(row)


def test_arith_rows_get_answer_sized_prompts_and_a_math_override_unless_their_own(tokenizer):
    row = {"data_source": "arith", "prompt": [{"role": "user", "content": "What is 7 + 5?"}],
           "reward_model": {"ground_truth": "12"}}  # fmt: skip
    task = Task.from_row(row)
    assert (task.kind, task.templates) == ("math", "arith")  # graded as math, prompted as the arith family
    builder = PromptBuilder()
    solve = builder.solve(task, tokenizer, BIG).text
    assert solve == "What is 7 + 5? Reply with the number only, as \\boxed{answer}." and "step by step" not in solve
    feedback = builder.feedback(task, "13", "", tokenizer, BIG).text
    assert "one sentence" in feedback and "Do not give the answer" in feedback and "12" not in feedback
    refine = builder.refine(task, "13", "Check the sum.", tokenizer, BIG).text
    assert refine.endswith("Reply with the corrected number only, as \\boxed{answer}.") and "Check the sum." in refine
    assert "step by step" in builder.solve(MATH, tokenizer, BIG).text  # a math row keeps the step-by-step family
    # an override of the math template reaches arith rows (the relay task's short templates), unless its own is given
    assert PromptBuilder({"solve": "S {problem}"}).solve(task, tokenizer, BIG).text == "S What is 7 + 5?"
    both = PromptBuilder({"solve": "S {problem}", "arith_solve": "A {problem}"})
    assert both.solve(task, tokenizer, BIG).text == "A What is 7 + 5?" and both.solve(MATH, tokenizer, BIG).text == (
        f"S {PROBLEM}"
    )


def test_code_prompts(tokenizer):
    task, builder = Task.from_row(_mbpp_row()), PromptBuilder()
    solve = builder.solve(task, tokenizer, BIG).text
    assert task.problem in solve and "```python" in solve and "Python programmer" in solve
    assert "\\boxed" not in solve and "math" not in solve
    code = "```python\ndef add(a, b):\n    return a - b\n```"
    execution = "0 of 3 tests passed. First failure: AssertionError: assert add(1, 2) == 3 (left side evaluated to -1)"
    feedback = builder.feedback(task, code, execution, tokenizer, BIG).text
    assert "programming mentor" in feedback and "Do not write any code" in feedback
    assert code in feedback and f"Execution result:\n{execution}" in feedback and feedback.endswith("Feedback:")
    assert "assert add(2, 2) == 4" not in feedback  # hidden tests are not listed (only a failing one's message)
    refine = builder.refine(task, code, "Subtract less.", tokenizer, BIG).text
    assert code in refine and "Subtract less." in refine and refine.endswith("```python code block.")
    alone = builder.refine(task, code, None, tokenizer, BIG).text
    assert code in alone and "mentor" not in alone and "```python" in alone


# ---------------------------------------------------------------- overrides


def test_override_replaces_one_template(tokenizer):
    builder = PromptBuilder(overrides={"solve": "Q: {problem}\nA:", "code_feedback": "{problem}|{attempt}|{execution}"})
    assert builder.solve(MATH, tokenizer, BIG).text == f"Q: {PROBLEM}\nA:"
    assert builder.feedback(Task("T", "code"), "z", "e", tokenizer, BIG).text == "T|z|e"
    # the others keep their defaults
    assert builder.feedback(MATH, ATTEMPT, "", tokenizer, BIG) == PromptBuilder().feedback(
        MATH, ATTEMPT, "", tokenizer, BIG
    )


def test_bad_overrides_name_the_key():
    assert override_errors({"solve": "{problem}", "code_refine": "{problem} {attempt} {feedback}"}) == []
    (error,) = override_errors({"code_solve": "{problem} {execution}"})
    assert "mlmt.prompts.overrides.code_solve" in error and "['execution']" in error
    (error,) = override_errors({"solv": "{problem}"})
    assert "mlmt.prompts.overrides.solv: unknown template" in error
    (error,) = override_errors({"feedback": "{problem"})
    assert "mlmt.prompts.overrides.feedback: not a format string" in error
    with pytest.raises(ValueError, match="code_solve"):
        PromptBuilder({"code_solve": "{attempt}"})


def test_unknown_template_name_raises():
    with pytest.raises(KeyError, match="unknown prompt template"):
        PromptBuilder().template("solv")


# ---------------------------------------------------------------- the token budget


def test_share_tokens_gives_what_short_quotes_leave_to_long_ones():
    assert share_tokens({"attempt": 1000, "feedback": 30}, 200) == {"attempt": 170, "feedback": 30}
    assert share_tokens({"attempt": 1000, "feedback": 900}, 200) == {"attempt": 100, "feedback": 100}
    assert share_tokens({"attempt": 10, "feedback": 20}, 200) == {"attempt": 10, "feedback": 20}
    assert share_tokens({"attempt": 50}, 0) == {"attempt": 0}


@pytest.mark.parametrize("budget", [230, 300, 600])
def test_a_very_long_attempt_is_shortened_by_tokens_to_fit_the_budget(tokenizer, budget):
    attempt = _long_attempt()
    attempt_tokens = len(tokenizer.encode(attempt, add_special_tokens=False))
    assert attempt_tokens > 10 * budget
    prompt = PromptBuilder().feedback(MATH, attempt, "", tokenizer, budget)
    assert len(prompt.ids) <= budget and prompt.ids == chat_ids(tokenizer, prompt.text)
    assert prompt.shortened and budget - 40 < len(prompt.ids)  # shortened to the budget, not far below it
    assert attempt not in prompt.text
    assert "HEAD-OF-ATTEMPT" in prompt.text and prompt.text.split("Feedback:")[0].endswith("\\boxed{41}.\n\n")
    assert f"[... {prompt.omitted_tokens} tokens omitted ...]" in prompt.text
    assert attempt_tokens - prompt.omitted_tokens < budget  # what was kept of the attempt
    assert prompt.text.endswith(_tail("feedback", "{attempt}"))  # the instruction after the quote survives
    assert PROBLEM in prompt.text


def test_a_prompt_exactly_at_budget_is_untouched_and_one_token_less_shortens(tokenizer):
    builder = PromptBuilder()
    full = builder.refine(MATH, ATTEMPT, FEEDBACK, tokenizer, BIG)
    at = builder.refine(MATH, ATTEMPT, FEEDBACK, tokenizer, len(full.ids))
    assert at == full and not at.shortened
    under = builder.refine(MATH, ATTEMPT, FEEDBACK, tokenizer, len(full.ids) - 1)
    assert under.shortened and len(under.ids) <= len(full.ids) - 1
    assert under.text.endswith(_tail("refine", "{feedback}"))


def test_refine_shares_the_room_between_a_long_attempt_and_a_long_feedback(tokenizer):
    attempt, feedback = _long_attempt(), "START-OF-FEEDBACK " + "check " * 2000 + "END-OF-FEEDBACK"
    prompt = PromptBuilder().refine(MATH, attempt, feedback, tokenizer, 400)
    assert len(prompt.ids) <= 400 and prompt.text.count("tokens omitted") == 2
    assert "HEAD-OF-ATTEMPT" in prompt.text and "\\boxed{41}." in prompt.text
    assert "START-OF-FEEDBACK" in prompt.text and "END-OF-FEEDBACK" in prompt.text
    omitted = [int(n) for n in re.findall(r"\[\.\.\. (\d+) tokens omitted", prompt.text)]
    totals = [len(tokenizer.encode(text, add_special_tokens=False)) for text in (attempt, feedback)]
    kept = [total - n for total, n in zip(totals, omitted, strict=True)]
    assert abs(kept[0] - kept[1]) <= 1 and sum(omitted) == prompt.omitted_tokens, (kept, omitted)  # an even share
    # a short feedback is quoted whole; the attempt gets the rest of the room
    short = PromptBuilder().refine(MATH, attempt, FEEDBACK, tokenizer, 400)
    assert len(short.ids) <= 400 and f"Feedback from a tutor:\n{FEEDBACK}\n" in short.text
    assert short.text.count("tokens omitted") == 1


def test_quotes_are_measured_with_the_receiving_models_tokenizer(tokenizer, other_tokenizer):
    attempt = _long_attempt()
    for reader in (tokenizer, other_tokenizer):
        prompt = PromptBuilder().feedback(MATH, attempt, "", reader, 300)
        assert prompt.ids == chat_ids(reader, prompt.text) and 260 < len(prompt.ids) <= 300
    # the small vocabulary needs more tokens for the same text: it keeps less of the attempt
    kept = [
        300 - PromptBuilder().feedback(MATH, attempt, "", t, 300).omitted_tokens for t in (tokenizer, other_tokenizer)
    ]
    assert len(tokenizer.encode(attempt)) != len(other_tokenizer.encode(attempt)) and kept[0] != kept[1]


def test_a_long_execution_result_is_shortened_too(tokenizer):
    task = Task("Write add(a, b).", "code", json.dumps(["assert add(1, 2) == 3"]))
    execution = "0 of 1 tests passed. First failure: " + "Traceback line\n" * 400
    prompt = PromptBuilder().feedback(task, "def add(a, b): return 0", execution, tokenizer, 400)
    assert len(prompt.ids) <= 400 and "def add(a, b): return 0" in prompt.text  # the short code is kept whole
    assert "0 of 1 tests passed" in prompt.text and "tokens omitted" in prompt.text


def test_a_problem_too_long_for_the_budget_is_an_error_naming_the_key(tokenizer):
    builder = PromptBuilder()
    solve_tokens = len(builder.solve(MATH, tokenizer, BIG).ids)
    with pytest.raises(PromptTooLongError, match=rf"solve prompt needs {solve_tokens} tokens.*max_prompt_length=40"):
        builder.solve(MATH, tokenizer, 40)
    with pytest.raises(PromptTooLongError, match="refine prompt needs .* with its quotes elided.*length=60") as error:
        builder.refine(MATH, _long_attempt(), FEEDBACK, tokenizer, 60)
    assert isinstance(error.value, ValueError)


def test_largest_prompt_is_the_longest_problems_largest_template_with_minimal_quotes(tokenizer, other_tokenizer):
    tasks = [MATH, Task("What is 1 + 1?", "math"), Task(PROBLEM * 4, "math"), Task.from_row(_mbpp_row())]
    builder = PromptBuilder(min_quote_tokens=16)
    tokens, name, index = builder.largest_prompt(tasks, {"ll": tokenizer, "hl": other_tokenizer})
    assert index == 2 and name in ("refine", "feedback")
    marker = ELISION.format(n=99999)
    with_markers = builder.refine(tasks[2], marker, marker, tokenizer, BIG)
    assert tokens >= len(with_markers.ids) + 2 * 16
    # at that budget, any attempt and feedback fit, each keeping about min_quote_tokens or more
    prompt = builder.refine(tasks[2], _long_attempt(), "x " * 3000, tokenizer, tokens)
    assert len(prompt.ids) <= tokens and prompt.text.count("tokens omitted") == 2
    for check_tokenizer, turn in ((tokenizer, "refine"), (other_tokenizer, "feedback")):
        needed = builder.required_tokens(turn, check_tokenizer, tasks[2].problem)
        assert needed <= tokens
