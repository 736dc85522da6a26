"""The episode runner's prompts: chosen by each task's kind, a code attempt's real sandbox run shown to the feedback
writer, and every turn-2/3 prompt within the budget however long the quoted turns are.

The two policies are scripted (a fixed reply per turn, like nanochat's MockModel): what is tested is what the runner
builds around them, with real tokenizers and the real code sandbox.
"""

import asyncio
import json

import numpy as np
import pytest
from scripted_policy import ScriptedPolicy

from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings
from agent_system.prompts.templates import PromptBuilder, Task, chat_ids
from agent_system.rewards.code_sandbox import SandboxLimits
from agent_system.trainer.metrics import episode_metrics, trajectory_records
from agent_system.trainer.rows import StepScores

TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
CODE_ROW = {
    "data_source": "mbpp",
    "prompt": [
        {
            "role": "user",
            "content": "Write a function add(a, b).\n\nYour code should pass this test, among others:\n" + TESTS[0],
        }
    ],  # fmt: skip
    "ability": "code",
    "reward_model": {"style": "rule", "ground_truth": json.dumps(TESTS)},
    "extra_info": {"index": 0, "entry_point": "add", "test_setup_code": ""},
}
MATH_ROW = {
    "data_source": "math",
    "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"index": 1},
}
WRONG_CODE = "```python\ndef add(a, b):\n    return a * b\n```"  # passes add(2, 2) only


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    from agent_system.models.tiny import build_tiny_tokenizer

    paths = {}
    for level, (vocab, seed) in {"ll": (512, 0), "hl": (300, 1)}.items():
        paths[level] = tmp_path_factory.mktemp(f"{level}_tokenizer")
        build_tiny_tokenizer(paths[level], vocab_size=vocab, seed=seed)
    return {level: AutoTokenizer.from_pretrained(path) for level, path in paths.items()}


def _run(tokenizers, replies_ll, replies_hl, budget, tasks, n=1, m=2):
    ll, hl = ScriptedPolicy(tokenizers["ll"], replies_ll), ScriptedPolicy(tokenizers["hl"], replies_hl)
    runner = EpisodeRunner(ll, hl, tokenizers["ll"], tokenizers["hl"], PromptBuilder(), SandboxLimits(60.0, 30.0))
    settings = EpisodeSettings(n, m, 8000, 8000, budget, 1.0, 1.0)
    return asyncio.run(runner.run(tasks, settings, "s1"))


@pytest.mark.external
def test_code_and_math_tasks_get_their_own_prompts_and_the_hl_sees_the_execution_result(tokenizers):
    tasks = [Task.from_row(CODE_ROW), Task.from_row(MATH_ROW)]
    replies_ll = {"t1": WRONG_CODE, "t3": "```python\ndef add(a, b):\n    return a + b\n```"}
    code_episode, math_episode = _run(tokenizers, replies_ll, {"t2": "Check the operator."}, 4096, tasks)
    attempt = code_episode.attempts[0]
    expected = (  # the shown test only: the hidden ones never reach the HL (test_code_feedback_visibility_on_cpu.py)
        "0 of 1 tests shown in the task passed. First failure: AssertionError: assert add(1, 2) == 3  "
        "(left side evaluated to 2)"
    )
    assert attempt.execution == expected  # run in the real sandbox
    assert "Python programmer" in attempt.attempt.prompt.text and "```python" in attempt.attempt.prompt.text
    for refinement in attempt.refinements:
        feedback_prompt = refinement.feedback.prompt.text
        assert "programming mentor" in feedback_prompt and f"Execution result:\n{expected}" in feedback_prompt
        assert WRONG_CODE in feedback_prompt and "\\boxed" not in feedback_prompt
        assert refinement.feedback.prompt.ids == chat_ids(tokenizers["hl"], feedback_prompt)  # the HL's tokenizer
        refine_prompt = refinement.refinement.prompt.text
        assert (
            "Feedback from a mentor:\nCheck the operator." in refine_prompt and "Execution result" not in refine_prompt
        )
    math_attempt = math_episode.attempts[0]
    assert math_attempt.execution == "" and "\\boxed{answer}" in math_attempt.attempt.prompt.text
    assert "math tutor" in math_attempt.refinements[0].feedback.prompt.text
    scores = StepScores(r1=np.zeros((2, 1)), r3=np.ones((2, 1, 2)))
    records = trajectory_records([CODE_ROW, MATH_ROW], [code_episode, math_episode], scores)
    assert records[0]["execution_result"] == expected and "execution_result" not in records[2]
    assert records[0]["prompts"]["feedback"] == attempt.refinements[0].feedback.prompt.text


@pytest.mark.external
def test_long_turns_never_overflow_the_budget_and_are_counted(tokenizers):
    long_code = "```python\n" + "".join(f"x{i} = {i}\n" for i in range(600)) + "def add(a, b):\n    return 0\n```"
    long_feedback = "Think again. " * 300
    tasks = [Task.from_row(CODE_ROW), Task.from_row(MATH_ROW)]
    budget, _, _ = PromptBuilder().largest_prompt(tasks, tokenizers)  # the smallest budget start-up accepts
    episodes = _run(tokenizers, {"t1": long_code, "t3": "ok"}, {"t2": long_feedback}, budget, tasks, n=2, m=2)
    turns = [t for e in episodes for a in e.attempts for r in a.refinements for t in (r.feedback, r.refinement)]
    assert all(len(t.prompt_ids) <= budget for t in turns)
    assert all(t.shortened for t in turns)  # every turn-2/3 prompt quotes a long attempt
    assert "def add(a, b):\n    return 0" in turns[0].prompt.text  # the tail of the attempt is kept
    scores = StepScores(r1=np.zeros((2, 2)), r3=np.zeros((2, 2, 2)))
    metrics = episode_metrics(episodes, scores, prefix="train")
    assert metrics["train/shortened_prompts"] == 16  # 2 problems x 2 attempts x 2 feedbacks x (turn 2 + turn 3)
    assert metrics["train/omitted_quote_tokens"] == sum(t.prompt.omitted_tokens for t in turns) > 0


def test_every_request_of_a_run_has_its_own_id_which_names_its_round(tokenizers):
    """The id seeds the request's sample under ``rollout.full_determinism`` (policy.request_seed): an id used twice in
    a run would give two rollouts the same draws (the ids once repeated from step to step)."""
    ll = ScriptedPolicy(tokenizers["ll"], {"t1": "4", "t3": "4", "ref": "4"})  # ref: the refinement without feedback
    hl = ScriptedPolicy(tokenizers["hl"], {"t2": "ok"})
    runner = EpisodeRunner(ll, hl, tokenizers["ll"], tokenizers["hl"], PromptBuilder(), SandboxLimits(60.0, 30.0))
    settings = EpisodeSettings(2, 3, 64, 64, 4096, 1.0, 1.0, with_reference_refinement=True)
    tasks = [Task.from_row(MATH_ROW), Task.from_row({**MATH_ROW, "extra_info": {"index": 2}})]
    for round_id in ("s1", "s2", "val/s2/b0"):
        asyncio.run(runner.run(tasks, settings, round_id))
    for policy, per_round in ((ll, 2 * 2 * (1 + 3 + 1)), (hl, 2 * 2 * 3)):
        assert len(policy.request_ids) == 3 * per_round == len(set(policy.request_ids))
        assert sum(rid.startswith("s2/") for rid in policy.request_ids) == per_round
