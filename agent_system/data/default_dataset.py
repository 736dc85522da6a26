"""The embedded default dataset: seeded arithmetic and one-step word problems (data_source ``arith``).

Generated offline and deterministically, easy enough for a 135M instruct model to solve sometimes, with a
mix of difficulty (1: one small operation, 2: larger numbers or word problems, 3: two operations or a
fraction). The trainer's embedded default (``mlmt.dataset.max_difficulty=1``) keeps difficulty 1 only: measured with
SmolLM2-135M-Instruct at temperature 1.0 and 64 tokens, 4 samples per problem, turn-1 accuracy is 0.15 with 22 of 48
problems' groups mixed (some right, some wrong), against 0.08 and 14 of 48 on the full mix (measured on version 1 of
the generator, before the held-out partition, with the step-by-step math prompts). Its rows are prompted with the
answer-sized ``arith`` templates (:mod:`agent_system.prompts.templates`), which measure higher
(``benchmarks/default_task_signal.py``, docs/MEASUREMENTS.md, "The main job"). Each row has a short
``reference_solution`` ending with ``\\boxed{answer}``.

Usage::

    python -m agent_system.data.default_dataset --out-dir data/arith            # 512 train / 64 val
    python -m agent_system.data.default_dataset --out-dir data/arith --n-train 2048 --n-val 128 --seed 1
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
from fractions import Fraction

from agent_system.data.schema import make_row, write_parquet_atomic

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # bump when the generator changes, so cached files are not reused (2: held-out partition)
HELD_OUT_SHARE = 4  # one question in this many (by the hash of its text) is a validation question, never a train one
_NAMES = ("Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Zoe")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "flowers")


def _expression(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    """A bare arithmetic question: (question, answer, solution steps)."""
    top = 10 if difficulty == 1 else 50
    op = rng.choice("+-*/" if difficulty > 1 else "+-*")
    a, b = rng.randint(1, top), rng.randint(1, top)
    if op == "-":
        a, b = max(a, b), min(a, b)
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12 if difficulty == 1 else 25)
    if op == "/":
        b = rng.randint(2, 12)
        a = b * rng.randint(2, 12)
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    shown = {"*": "\\times", "/": "\\div"}.get(op, op)
    question = f"What is {a} {'×' if op == '*' else op} {b}?"
    return question, str(value), f"${a} {shown} {b} = {value}$."


def _word_problem(rng: random.Random) -> tuple[str, str, str]:
    """A one-step word problem."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    if kind == 0:
        return (
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            str(a + b),
            f"{name} has ${a} + {b} = {a + b}$ {item}.",
        )
    if kind == 1:
        a, b = max(a, b) + 1, min(a, b)
        return (
            f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?",
            str(a - b),
            f"{name} has ${a} - {b} = {a - b}$ {item} left.",
        )
    if kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return (
            f"There are {a} boxes with {b} {item} in each box. How many {item} are there in total?",
            str(a * b),
            f"There are ${a} \\times {b} = {a * b}$ {item}.",
        )
    per, kids = rng.randint(2, 9), rng.randint(2, 6)
    return (f"{per * kids} {item} are shared equally among {kids} children. How many {item} does each child get?",
            str(per), f"Each child gets ${per * kids} \\div {kids} = {per}$ {item}.")  # fmt: skip


def _two_step(rng: random.Random) -> tuple[str, str, str]:
    """Two operations or a fraction sum (a rational answer)."""
    if rng.random() < 0.3:
        x, y = Fraction(1, rng.randint(2, 6)), Fraction(1, rng.randint(2, 6))
        total = x + y
        num, den = total.numerator, total.denominator
        answer = str(num) if den == 1 else f"\\frac{{{num}}}{{{den}}}"
        return (f"What is {x} + {y}? Give the answer as a fraction in lowest terms.", answer,
                f"$\\frac{{1}}{{{x.denominator}}} + \\frac{{1}}{{{y.denominator}}} = {answer}$.")  # fmt: skip
    a, b, c = rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        steps = f"First ${b} \\times {c} = {b * c}$, then ${a} + {b * c} = {a + b * c}$."
        return f"What is {a} + {b} × {c}?", str(a + b * c), steps
    steps = f"First ${a} + {b} = {a + b}$, then ${a + b} \\times {c} = {(a + b) * c}$."
    return f"What is ({a} + {b}) × {c}?", str((a + b) * c), steps


def generate_problem(rng: random.Random, max_difficulty: int = 3) -> dict:
    """Draws one problem with difficulty 1 (40%), 2 (40%) or 3 (20%), among those at most ``max_difficulty``.

    Returns:
        ``{"question", "answer", "solution", "difficulty"}``.
    """
    if max_difficulty < 1:
        raise ValueError(f"max_difficulty={max_difficulty}: use 1, 2 or 3")
    draw = rng.random() * (0.4 if max_difficulty == 1 else 0.8 if max_difficulty == 2 else 1.0)
    if draw < 0.4:
        difficulty, (question, answer, steps) = 1, _expression(rng, 1)
    elif draw < 0.8:
        difficulty = 2
        question, answer, steps = _word_problem(rng) if rng.random() < 0.6 else _expression(rng, 2)
    else:
        difficulty, (question, answer, steps) = 3, _two_step(rng)
    solution = f"{steps} The answer is $\\boxed{{{answer}}}$."
    return {"question": question, "answer": answer, "solution": solution, "difficulty": difficulty}


def is_held_out(question: str) -> bool:
    """Whether a question belongs to the validation part of the problem space (a fixed quarter, by a hash of its text).

    The split does not depend on the seed or the sizes, so the validation rows of any call (any ``n_val``, any seed)
    are disjoint from the training rows of any other call: a file of 32 validation problems is held out from a run
    that generated only 8.
    """
    return int(hashlib.sha1(question.encode("utf-8")).hexdigest()[:8], 16) % HELD_OUT_SHARE == 0


def generate_rows(n_train: int, n_val: int, seed: int, max_difficulty: int = 3) -> tuple[list[dict], list[dict]]:
    """Generates train and validation rows.

    Validation questions are distinct and held out (:func:`is_held_out`); train questions never are, so no
    validation question of any seed or size appears in any training set. Train may repeat a question (the easy
    problem space is small), which is fine for RL sampling.
    """
    rng = random.Random(seed)
    val_questions: set[str] = set()
    splits: dict[str, list[dict]] = {"val": [], "train": []}
    for split, count in (("val", n_val), ("train", n_train)):
        for _ in range(200 * (count + 10)):
            if len(splits[split]) >= count:
                break
            problem = generate_problem(rng, max_difficulty)
            if problem["question"] in val_questions or is_held_out(problem["question"]) != (split == "val"):
                continue
            if split == "val":
                val_questions.add(problem["question"])
            extra = {
                "index": len(splits[split]),
                "split": split,
                "reference_solution": problem["solution"],
                "question": problem["question"],
                "difficulty": problem["difficulty"],
            }
            splits[split].append(make_row("arith", problem["question"], "math", problem["answer"], extra))
        if len(splits[split]) < count:
            raise ValueError(f"cannot draw {count} {split} problems; ask for fewer")
    return splits["train"], splits["val"]


def ensure_default_dataset(
    out_dir: str, n_train: int = 512, n_val: int = 64, seed: int = 0, max_difficulty: int = 3
) -> tuple[str, str]:
    """Creates the default train/val parquet files unless they already exist.

    The parameters are part of the file names, so a call with other parameters never reuses stale files.

    Args:
        out_dir: Folder for the two files.
        n_train: Number of training problems.
        n_val: Number of validation problems.
        seed: Generator seed.
        max_difficulty: 1 (one small operation) to 3 (the full mix).

    Returns:
        ``(train_path, val_path)``.
    """
    stem = f"arith_v{FORMAT_VERSION}_seed{seed}_ntrain{n_train}_nval{n_val}_difficulty{max_difficulty}"
    train_path = os.path.join(os.path.abspath(out_dir), f"{stem}_train.parquet")
    val_path = os.path.join(os.path.abspath(out_dir), f"{stem}_val.parquet")
    if os.path.isfile(train_path) and os.path.isfile(val_path):
        logger.info("reusing default dataset %s", stem)
        return train_path, val_path
    train_rows, val_rows = generate_rows(n_train, n_val, seed, max_difficulty)
    write_parquet_atomic(val_rows, val_path)
    write_parquet_atomic(train_rows, train_path)
    logger.info("wrote %d train / %d val problems to %s", n_train, n_val, out_dir)
    return train_path, val_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for the train/val parquet files")
    parser.add_argument("--n-train", type=int, default=512, help="number of training problems")
    parser.add_argument("--n-val", type=int, default=64, help="number of validation problems")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--max-difficulty", type=int, default=3, choices=(1, 2, 3), help="1: one small operation")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    train_path, val_path = ensure_default_dataset(
        args.out_dir, args.n_train, args.n_val, args.seed, args.max_difficulty
    )
    logger.info("train: %s", train_path)
    logger.info("val: %s", val_path)


if __name__ == "__main__":
    main()
