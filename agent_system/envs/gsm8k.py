"""GSM8K as a gym-like environment, and the few-shot prompt the ``reinforce_kl`` recipe trains on.

LLM_RL (the seed of ``recipes/reinforce_kl``) trains on GSM8K with few-shot prompts: k solved examples from the
train split before the question. This module holds that prompt and the environment around it, so the environment
and the trainer read the SAME text and are graded by the SAME grader:

* :func:`few_shot_problem` / :func:`pick_shots`: the problem text of one item: k train examples (chosen by a seeded
  RNG keyed on the item's index, never the item itself: an example with the same question is excluded), each with
  its rationale (calculator annotations ``<<...>>`` removed) ending in ``\\boxed{N}``, then the question.
  ``python -m agent_system.data.preprocess --dataset gsm8k --few-shot K`` bakes it into each parquet row's prompt
  (:func:`add_few_shot`), so the trainer's solve template (``agent_system/prompts/templates.py``) wraps it unchanged.
* :class:`GSM8KEnv`: ``reset()`` → observation (the solve template around the few-shot problem: the user message
  the trainer's solver reads), ``step(action)`` → ``(observation, reward, done, info)``. The reward is the project's
  math grader (``agent_system.rewards.compute_score`` with data source ``gsm8k``: math-verify, then the last number).

Steps: LLM_RL's environment is stepwise (``max_trajectory_steps``: each action is one reasoning step; the episode
ends when an answer is given or the steps run out). ``max_steps=1`` (the default, and what the trainer does) takes
the whole solution as one action. With ``max_steps > 1`` each action is appended to the solution so far (the next
observation is the prompt plus that solution); the episode ends when an action holds a ``\\boxed{}`` answer or after
``max_steps`` actions, and the full solution is graded then (reward 0 on earlier steps).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from agent_system.prompts.templates import PromptBuilder
from agent_system.rewards.math_answer import gsm8k_gold, last_boxed_content

_CALCULATOR = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"\n?####\s*(.+?)\s*$", re.S)


def load_gsm8k(path: str | Path) -> list[dict]:
    """GSM8K records (``question``, ``answer``) from a JSONL file; an error names the file and line of a bad one."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record.get("question"), str) or not gsm8k_gold(str(record.get("answer", ""))):
                raise ValueError(f"{path}:{number}: needs a 'question' and an 'answer' ending in '#### N'")
            records.append(record)
    return records


def worked_example(record: dict) -> str:
    """One shot: the question and its rationale without calculator annotations, ending in ``\\boxed{N}``."""
    rationale = _CALCULATOR.sub("", record["answer"])
    rationale = _FINAL.sub("", rationale).strip()
    return f"Question: {record['question'].strip()}\nSolution: {rationale}\n\\boxed{{{gsm8k_gold(record['answer'])}}}"


def pick_shots(pool: list[dict], k: int, seed: int, index: int, question: str) -> list[dict]:
    """k examples of ``pool`` for item ``index``: seeded by (seed, index), never one with the item's own question."""
    if k < 0:
        raise ValueError(f"few-shot k={k}: use k >= 0")
    candidates = [r for r in pool if r["question"].strip() != question.strip()]
    if len(candidates) < k:
        raise ValueError(f"few-shot k={k}: the example pool has only {len(candidates)} other questions")
    return random.Random(f"{seed}/{index}").sample(candidates, k)


def few_shot_problem(question: str, shots: list[dict]) -> str:
    """The problem text of one item: its worked examples, then its question."""
    if not shots:
        return question
    examples = "\n\n".join(worked_example(shot) for shot in shots)
    return f"Here are {len(shots)} solved examples.\n\n{examples}\n\nNow solve this one.\nQuestion: {question.strip()}"


def add_few_shot(rows: list[dict], pool: list[dict], k: int, seed: int) -> list[dict]:
    """GSM8K rows with the few-shot problem as their prompt (``extra_info.question`` keeps the bare question)."""
    for index, row in enumerate(rows):
        question = row["extra_info"]["question"]
        row["prompt"][0]["content"] = few_shot_problem(question, pick_shots(pool, k, seed, index, question))
        row["extra_info"]["few_shot"] = k
    return rows


class GSM8KEnv:
    """GSM8K items as episodes (see the module docstring): ``reset()`` → observation, ``step(action)``."""

    def __init__(self, items: list[dict], shot_pool: list[dict], k: int = 5, seed: int = 0, max_steps: int = 1) -> None:
        if not items:
            raise ValueError("GSM8KEnv: no items")
        if max_steps < 1:
            raise ValueError(f"GSM8KEnv: max_steps={max_steps}, use >= 1")
        self.items, self.pool, self.k, self.seed, self.max_steps = items, shot_pool, k, seed, max_steps
        self.prompts = PromptBuilder()
        self.order = random.Random(seed).sample(range(len(items)), len(items))
        self.episodes = 0
        self.index: int | None = None

    def reset(self, index: int | None = None) -> str:
        """Start an episode on item ``index`` (default: the next of a seeded shuffle); returns the prompt text."""
        if index is None:
            index = self.order[self.episodes % len(self.order)]
        self.episodes += 1
        self.index = index
        question = self.items[index]["question"]
        problem = few_shot_problem(question, pick_shots(self.pool, self.k, self.seed, index, question))
        self.prompt = self.prompts.template("solve").format(problem=problem)
        self.gold = gsm8k_gold(self.items[index]["answer"])
        self.solution, self.steps, self.done = "", 0, False
        return self.prompt

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """One action (the whole solution when ``max_steps == 1``); returns (observation, reward, done, info)."""
        if self.index is None or self.done:
            raise RuntimeError("GSM8KEnv.step: call reset() first (the episode is over or never started)")
        from agent_system.rewards import compute_score

        self.solution = f"{self.solution}\n{action}" if self.solution else action
        self.steps += 1
        self.done = self.steps >= self.max_steps or bool(last_boxed_content(action))
        info = {"index": self.index, "steps": self.steps, "gold": self.gold}
        reward = 0.0
        if self.done:
            result = compute_score("gsm8k", self.solution, self.gold)
            reward = float(result["score"])
            info["pred"] = result["pred"]
        return f"{self.prompt}\n\n{self.solution}", reward, self.done, info
