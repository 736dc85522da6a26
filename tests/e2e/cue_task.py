"""A toy task where feedback decides the outcome, for the learning tests (built in seconds, on CPU).

The problem is "What is one plus two?" (ground truth 3, graded by the ``arith`` rule: the last number of the
response). No prompt of the episode contains a digit except through the feedback: the problem is in words and the
solver's attempt is "I do not know". The **cue** is any digit in the feedback text.

:func:`train_cue_solver` fine-tunes a tiny random model (a few hundred supervised steps) on the exact turn prompts
the trainer builds (:mod:`agent_system.prompts.templates`): with a cue in the feedback it answers "The answer is 3"
(with probability ``p_right_given_cue``), otherwise "I do not know" (R3 = 0), and its turn-1 attempt is always
"I do not know" (R1 = 0). Feedback in training is random vocabulary tokens, as an untrained feedback writer emits.
An untrained tiny feedback writer (byte-level BPE vocabulary of 512, 43 tokens containing a digit) puts a digit in
a 4-token feedback about a quarter of the time: the starting R3 is in [0.1, 0.5].
"""

from __future__ import annotations

import random
import re

import pandas as pd
import torch

from agent_system.demos.warm_up import fine_tune, load
from agent_system.prompts.templates import PromptBuilder, Task

PROBLEM, ANSWER = "What is one plus two?", "3"
TASK = Task(PROBLEM, "math", ANSWER, family="arith")  # prompted as the trainer prompts the task's arith rows
RIGHT, WRONG = "The answer is 3", "I do not know"


def has_cue(text: str) -> bool:
    return any(c.isdigit() for c in text)


def _plain_and_digit_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The vocabulary's non-special token ids without a digit and with one."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    cued = {i for i in vocab if has_cue(tokenizer.decode([i]))}
    return [i for i in vocab if i not in cued], [i for i in vocab if i in cued]


def train_cue_solver(path: str, p_right_given_cue: float, steps: int = 250, feedback_tokens: int = 4, seed: int = 0):
    """Fine-tune the tiny model at ``path`` in place into the cue-following solver; returns the final loss."""
    rng = random.Random(seed)
    prompts, task = PromptBuilder(), TASK
    from transformers import AutoTokenizer

    plain, digit = _plain_and_digit_tokens(AutoTokenizer.from_pretrained(path))

    def example(tokenizer) -> tuple[list[int], str]:
        if rng.random() < 0.1:
            return prompts.solve(task, tokenizer, 512).ids, WRONG
        ids = [rng.choice(plain) for _ in range(rng.randint(0, feedback_tokens))]
        if rng.random() < 0.5:
            ids = ids[: feedback_tokens - 1]
            ids.insert(rng.randint(0, len(ids)), rng.choice(digit))
        feedback = tokenizer.decode(ids, skip_special_tokens=True)
        prompt = prompts.refine(task, WRONG, feedback, tokenizer, 512).ids
        right = has_cue(feedback) and rng.random() < p_right_given_cue
        return prompt, RIGHT if right else WRONG

    return fine_tune(path, example, steps, seed)


def right_given_cue_rate(path: str, feedbacks: int = 64, feedback_tokens: int = 4, seed: int = 7) -> float:
    """The share of ``feedbacks`` random cued feedbacks (drawn as an untrained feedback writer writes them:
    ``feedback_tokens`` vocabulary tokens, one of them a digit) after which the solver at ``path``, decoding greedily
    (8 tokens), refines to the right answer: the last number of its refinement is 3. Greedy on fixed
    feedbacks: the same model always gives the same rate, without sampling noise."""
    rng = random.Random(seed)
    tokenizer, model = load(path)
    prompts, task = PromptBuilder(), TASK
    plain, digit = _plain_and_digit_tokens(tokenizer)
    right = 0
    with torch.no_grad():
        for _ in range(feedbacks):
            ids = [rng.choice(plain) for _ in range(feedback_tokens - 1)]
            ids.insert(rng.randint(0, len(ids)), rng.choice(digit))
            feedback = tokenizer.decode(ids, skip_special_tokens=True)
            prompt = prompts.refine(task, WRONG, feedback, tokenizer, 512).ids
            output = model.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            numbers = re.findall(r"-?\d+", tokenizer.decode(output[0, len(prompt) :], skip_special_tokens=True))
            right += bool(numbers) and numbers[-1] == ANSWER
    return right / feedbacks


def write_dataset(folder, rows: int = 16) -> tuple[str, str]:
    """Train and validation parquet files of the cue task (the one problem, repeated)."""

    def frame(count: int, split: str) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "data_source": "arith",
                    "prompt": [{"role": "user", "content": PROBLEM}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": ANSWER},
                    "extra_info": {"index": i, "split": split, "reference_solution": RIGHT},
                }
                for i in range(count)
            ]
        )

    train, val = f"{folder}/cue_train.parquet", f"{folder}/cue_val.parquet"
    frame(rows, "train").to_parquet(train)
    frame(2, "val").to_parquet(val)
    return train, val
