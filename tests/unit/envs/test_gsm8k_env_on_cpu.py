"""agent_system/envs/gsm8k.py on real GSM8K rows (../shared/data/gsm8k beside the repository): the few-shot prompt,
the grader, steps.

The environment's observation must be the user message the trainer's solver reads for the same item: the solve
template around the problem text that ``preprocess --few-shot`` bakes into the parquet row.
"""

from __future__ import annotations

import pandas as pd
import pytest
from shared_data import shared_data

from agent_system.data.preprocess import preprocess
from agent_system.envs.gsm8k import GSM8KEnv, load_gsm8k, pick_shots
from agent_system.prompts.templates import PromptBuilder, Task


@pytest.fixture(scope="module")
def data():
    gsm8k = shared_data("gsm8k")
    return load_gsm8k(gsm8k / "test.jsonl")[:20], load_gsm8k(gsm8k / "train.jsonl")


@pytest.mark.external
def test_reset_gives_k_examples_and_not_the_items_answer(data):
    items, pool = data
    env = GSM8KEnv(items, pool, k=5, seed=3)
    for index in range(5):
        prompt = env.reset(index)
        item = items[index]
        assert prompt.count("Question: ") == 6  # 5 examples + the item
        assert prompt.count("\\boxed{") == 6  # each example's answer + the template's instruction
        assert prompt.count(item["question"].strip()) == 1
        rationale = item["answer"].split("####")[0].strip()
        assert rationale.splitlines()[0] not in prompt  # the item's own worked solution is never shown
        assert env.gold == item["answer"].split("####")[-1].strip().replace(",", "")
    assert GSM8KEnv(items, pool, k=5, seed=3).reset(2) == env.reset(2)  # seeded
    assert GSM8KEnv(items, pool, k=5, seed=4).reset(2) != env.reset(2)


@pytest.mark.external
def test_shots_never_include_the_item_itself(data):
    _, pool = data
    for index in range(30):  # a train item as the question: its own record is in the pool
        shots = pick_shots(pool, 5, 0, index, pool[index]["question"])
        assert len(shots) == 5 and all(s["question"] != pool[index]["question"] for s in shots)
    with pytest.raises(ValueError, match="only 1 other"):
        pick_shots(pool[:2], 2, 0, 0, pool[0]["question"])


@pytest.mark.external
def test_right_answer_rewarded_and_done_wrong_answer_zero(data):
    items, pool = data
    env = GSM8KEnv(items, pool, k=2)
    env.reset(0)
    gold = env.gold
    _, reward, done, info = env.step(f"Some work.\n\\boxed{{{gold}}}")
    assert (reward, done, info["steps"]) == (1.0, True, 1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("more")
    env.reset(0)
    _, reward, done, _ = env.step(f"\\boxed{{{int(gold) + 1}}}")
    assert (reward, done) == (0.0, True)
    env.reset(0)
    _, reward, done, _ = env.step("I do not know.")  # one step: the whole solution, graded even without an answer
    assert (reward, done) == (0.0, True)


@pytest.mark.external
def test_stepwise_episode_ends_on_an_answer_or_after_max_steps(data):
    items, pool = data
    env = GSM8KEnv(items, pool, k=1, max_steps=3)
    prompt = env.reset(1)
    observation, reward, done, _ = env.step("First step.")
    assert (reward, done) == (0.0, False) and observation.startswith(prompt) and observation.endswith("First step.")
    observation, reward, done, info = env.step(f"So \\boxed{{{env.gold}}}")
    assert (reward, done, info["steps"]) == (1.0, True, 2)
    assert "First step.\nSo \\boxed{" in observation
    env.reset(1)
    results = [env.step(f"step {i}") for i in range(3)]
    assert [r[2] for r in results] == [False, False, True] and results[-1][1] == 0.0


@pytest.mark.external
def test_env_prompt_is_the_trainers_solve_prompt(data, tmp_path):
    """The parquet row of ``preprocess --few-shot`` (what the trainer reads) renders to the env's observation."""
    items, pool = data
    path, gsm8k = tmp_path / "test.parquet", shared_data("gsm8k")
    preprocess(
        "gsm8k", str(path), str(gsm8k / "test.jsonl"), limit=4, few_shot=5, few_shot_pool=str(gsm8k / "train.jsonl")
    )
    rows = pd.read_parquet(path).to_dict(orient="records")
    env = GSM8KEnv(items, pool, k=5, seed=0)
    builder = PromptBuilder()
    for index, row in enumerate(rows):
        task = Task.from_row(row)
        assert builder.template("solve").format(problem=task.problem) == env.reset(index)
        assert row["reward_model"]["ground_truth"] == env.gold
        assert row["extra_info"]["question"] == items[index]["question"]


def test_few_shot_is_only_for_gsm8k(tmp_path):
    rows = tmp_path / "test.jsonl"
    rows.write_text('{"question": "What is 1 + 2?", "answer": "1 + 2 = 3\\n#### 3"}\n')
    with pytest.raises(ValueError, match="--few-shot"):
        preprocess("gsm8k", str(tmp_path / "x.parquet"), str(rows), limit=2, few_shot=2)
