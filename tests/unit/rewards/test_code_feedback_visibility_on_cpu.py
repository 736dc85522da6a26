"""The feedback writer (HL) never sees a hidden MBPP test or its expected value (issue 16 item 7).

An MBPP problem shows its first assert; the others are hidden. The HL reads the attempt's execution result: by default
it comes from the shown tests only. ``mlmt.code_feedback_tests=all`` restores the original's behaviour (every test,
the first failing one with its expected value), which leaks the ground truth. The episode runs with scripted policies,
real tokenizers and the real sandbox; what is checked is every prompt the HL was sent.
"""

import asyncio
import json

import pytest
from scripted_policy import ScriptedPolicy

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings
from agent_system.prompts.templates import PromptBuilder, Task
from agent_system.rewards.code_reward import execution_result
from agent_system.rewards.code_sandbox import SandboxLimits

ROOMY = SandboxLimits(timeout_s=60.0, per_test_s=30.0)
HIDDEN_EXPECTED = 98765  # the expected value of a hidden test: must never reach the HL
TESTS = ["assert add(1, 2) == 3", f"assert add(40000, 58765) == {HIDDEN_EXPECTED}"]
PROBLEM = "Write a function add(a, b).\n\nYour code should pass this test, among others:\n" + TESTS[0]
ROW = {
    "data_source": "mbpp",
    "prompt": [{"role": "user", "content": PROBLEM}],
    "ability": "code",
    "reward_model": {"style": "rule", "ground_truth": json.dumps(TESTS)},
    "extra_info": {"index": 0, "entry_point": "add", "test_setup_code": "", "question": PROBLEM},
}
FAILS_HIDDEN = "```python\ndef add(a, b):\n    return a + b if a < 100 else 0\n```"  # passes the shown test only
FAILS_SHOWN = "```python\ndef add(a, b):\n    return a - b\n```"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from agent_system.models.tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer(path, vocab_size=512, seed=0)
    return AutoTokenizer.from_pretrained(path)


def _hl_prompts(tokenizer, attempt: str, **options) -> tuple[list[str], str]:
    ll = ScriptedPolicy(tokenizer, {"t1": attempt, "t3": attempt})
    hl = ScriptedPolicy(tokenizer, {"t2": "Check the branch."})
    runner = EpisodeRunner(ll, hl, tokenizer, tokenizer, PromptBuilder(), ROOMY, **options)
    settings = EpisodeSettings(1, 2, 4000, 4000, 4096, 1.0, 1.0)
    (episode,) = asyncio.run(runner.run([Task.from_row(ROW)], settings, "s1"))
    return hl.texts, episode.attempts[0].execution


@pytest.mark.external
def test_the_hl_never_sees_a_hidden_test_by_default(tokenizer):
    texts, execution = _hl_prompts(tokenizer, FAILS_HIDDEN)
    assert execution == "All 1 tests shown in the task passed."
    assert len(texts) == 2 and all(str(HIDDEN_EXPECTED) not in text and "58765" not in text for text in texts)
    texts, execution = _hl_prompts(tokenizer, FAILS_SHOWN)  # a failing shown test is reported with its left side
    expected = "0 of 1 tests shown in the task passed. First failure: AssertionError: assert add(1, 2) == 3"
    assert execution == expected + "  (left side evaluated to -1)"
    assert all(str(HIDDEN_EXPECTED) not in text for text in texts) and all(expected in text for text in texts)


@pytest.mark.external
def test_the_original_leak_is_a_named_option(tokenizer):
    texts, execution = _hl_prompts(tokenizer, FAILS_HIDDEN, feedback_tests="all")
    assert execution.startswith(f"1 of 2 tests passed. First failure: AssertionError: {TESTS[1]}")
    assert all(str(HIDDEN_EXPECTED) in text for text in texts)  # the leak the option documents


@pytest.mark.external
def test_a_task_that_shows_no_test():
    extra = {"question": "Write a function add(a, b)."}
    good = execution_result("def add(a, b):\n    return a + b\n", TESTS, extra, ROOMY)
    assert good == "The task shows no test. The program runs without error."
    broken = execution_result("def add(a, b) return", TESTS, extra, ROOMY)
    assert broken.startswith("The task shows no test. The program failed to run: ") and "SyntaxError" in broken
    with pytest.raises(ValueError, match="tests='hidden'"):
        execution_result("", TESTS, extra, ROOMY, tests="hidden")


def test_the_option_is_validated_at_start_up():
    with pytest.raises(ConfigError, match="mlmt.code_feedback_tests='some'"):
        check_config(compose_config(["mlmt.code_feedback_tests=some"]))
    with pytest.raises(ConfigError, match="mlmt.code_feedback_tests=all cannot act with mlmt.feedback=self"):
        check_config(compose_config(["mlmt.code_feedback_tests=all", "mlmt.feedback=self"]))
    check_config(compose_config(["mlmt.code_feedback_tests=all"]))
