"""How often a step of the main job carries a learning signal: the embedded task's outcomes under a set of prompts.

Samples what one training step of the main job samples, outside the trainer: the embedded arithmetic problems
(``mlmt.dataset.max_difficulty`` 1), ``--n`` first attempts per problem, ``--m`` feedbacks per attempt and one
refinement per feedback, from SmolLM2-135M-Instruct at both levels (Hugging Face ``generate``, fp32, the trainer's
prompt templates and chat-template date), graded by the trainer's own ``compute_score``. It reports, per template set:

* turn-1 accuracy, and the share of turn-1 groups (the ``n`` attempts at one problem) with mixed outcomes: a GRPO
  group whose rewards are all equal has advantage 0 and teaches the solver nothing;
* turn-3 accuracy, and the share of HL groups (the ``m`` feedbacks on one attempt, scored by their refinements) with
  mixed outcomes;
* the share of turns stopped at their token cap (truncated answers are graded on what was cut);
* from those shares, the probability that a step of ``--problems-per-step`` problems has a signal at each level
  (at least one mixed group), assuming groups independent.

Usage::

    python benchmarks/default_task_signal.py                                   # both template sets, 48 problems
    python benchmarks/default_task_signal.py --problems 12 --n 2 --m 4 --problems-per-step 2 --sets trainer

``--sets`` names template sets: ``trainer`` (what the trainer renders for an ``arith`` row: the math templates,
step by step) and ``short`` (answer-sized candidates, given as ``mlmt.prompts.overrides`` of the math templates: the
number only, a one-sentence feedback), compared on the same problems and seeds. On 2 busy cores a set of 24 problems
× 4 attempts × 2 feedbacks takes tens of minutes (the refinement prompts' prefill dominates); turn 1's figures are
printed as soon as they are known.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_system.data.default_dataset import generate_rows
from agent_system.models.smollm2 import ensure_smollm2
from agent_system.prompts.templates import PromptBuilder, Task
from agent_system.rewards.scoring import compute_score

BUDGET = 768  # the CPU overlay's data.max_prompt_length


def template_sets() -> dict[str, dict[str, str]]:
    """``mlmt.prompts.overrides`` per set: ``trainer`` none, ``short`` answer-sized candidates."""
    short = {
        "solve": "{problem} Reply with the number only, as \\boxed{{answer}}.",
        "feedback": (
            "A student answered this question. Say in one sentence whether the answer is right and give a hint. "
            "Do not give the answer.\n\nQuestion: {problem}\n\nStudent's answer: {attempt}\n\nFeedback:"
        ),
        "refine": (
            "{problem}\n\nYour previous answer: {attempt}\n\nA tutor's feedback: {feedback}\n\n"
            "Reply with the corrected number only, as \\boxed{{answer}}."
        ),
    }
    return {"trainer": {}, "short": short}


def generate(model, tokenizer, prompts: list[list[int]], max_tokens: int, temperature: float, seed: int):
    """Left-padded sampling of every prompt once: ``(texts, truncated flags)``."""
    torch.manual_seed(seed)
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            pad_token_id=pad,
        )
    texts, truncated = [], []
    for row in out[:, width:].tolist():
        stop = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else None
        texts.append(tokenizer.decode(row[:stop], skip_special_tokens=True))
        truncated.append(stop is None)
    return texts, truncated


def grade(row: dict, text: str) -> float:
    return compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])["score"]


def mixed(groups: list[list[float]]) -> float:
    return sum(len(set(g)) > 1 for g in groups) / len(groups)


def measure(model, tokenizer, rows, builder: PromptBuilder, args) -> dict:
    tasks = [Task.from_row(row) for row in rows]
    solve = [builder.solve(t, tokenizer, BUDGET).ids for t in tasks for _ in range(args.n)]
    attempts, cut1 = generate(model, tokenizer, solve, args.tokens, args.temperature, args.seed)
    owners = [t for t in tasks for _ in range(args.n)]
    attempt_rows = [r for r in rows for _ in range(args.n)]
    r1 = [grade(row, text) for row, text in zip(attempt_rows, attempts, strict=True)]
    ll_mixed = mixed([r1[i : i + args.n] for i in range(0, len(r1), args.n)])
    print(f"  acc@t1 {sum(r1) / len(r1):.3f}, t1 groups mixed {ll_mixed:.3f}, t1 truncated "
          f"{sum(cut1) / len(cut1):.2f}, e.g. {attempts[0][:60]!r}", flush=True)  # fmt: skip
    feedback_prompts = [
        builder.feedback(t, a, "", tokenizer, BUDGET).ids for t, a in zip(owners, attempts, strict=True)
    ]
    feedback_prompts = [p for p in feedback_prompts for _ in range(args.m)]
    feedbacks, cut2 = generate(model, tokenizer, feedback_prompts, args.hl_tokens, args.temperature, args.seed + 1)
    refine = [
        builder.refine(owners[i // args.m], attempts[i // args.m], f, tokenizer, BUDGET).ids
        for i, f in enumerate(feedbacks)
    ]
    refinements, cut3 = generate(model, tokenizer, refine, args.tokens, args.temperature, args.seed + 2)
    gold_rows = [r for r in rows for _ in range(args.n * args.m)]
    r3 = [grade(row, text) for row, text in zip(gold_rows, refinements, strict=True)]
    hl_mixed = mixed([r3[i : i + args.m] for i in range(0, len(r3), args.m)])
    per_step = args.problems_per_step
    return {
        "acc@t1": sum(r1) / len(r1),
        "acc@t3": sum(r3) / len(r3),
        "t1 groups mixed": ll_mixed,
        "HL groups mixed": hl_mixed,
        "truncated t1/t2/t3": "/".join(f"{sum(c) / len(c):.2f}" for c in (cut1, cut2, cut3)),
        "P(LL signal in a step)": 1 - (1 - ll_mixed) ** per_step,
        "P(HL signal in a step)": 1 - (1 - hl_mixed) ** (per_step * args.n),
        "example t1": attempts[0][:80],
        "example t3": refinements[0][:80],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=48, help="training problems sampled")
    parser.add_argument("--n", type=int, default=4, help="first attempts per problem (mlmt.n)")
    parser.add_argument("--m", type=int, default=2, help="feedbacks per attempt (mlmt.m)")
    parser.add_argument("--problems-per-step", type=int, default=4, help="data.train_batch_size of the run")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=64, help="LL tokens per turn (data.max_response_length)")
    parser.add_argument("--hl-tokens", type=int, default=48, help="HL tokens per feedback (hl.rollout.response_length)")
    parser.add_argument("--sets", default="trainer,math", help="template sets, comma-separated (trainer, math)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(args.seed)
    folder = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    rows, _ = generate_rows(args.problems, 0, args.seed, max_difficulty=1)
    sets = template_sets()
    for name in args.sets.split(","):
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        figures = measure(model, tokenizer, rows, PromptBuilder(sets[name]), args)
        print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
        for key, value in figures.items():
            print(f"  {key:24s} {value:.3f}" if isinstance(value, float) else f"  {key:24s} {value!r}", flush=True)


if __name__ == "__main__":
    main()
