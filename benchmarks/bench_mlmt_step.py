"""Benchmark: the two-model MLMT step, phase by phase, against a single-model GRPO step with the same token budget.

    python benchmarks/bench_mlmt_step.py [--model tiny|smollm2] [--steps 2] [--schedule both|alternate] [--n 2]

Both variants run in one process, interleaved (MLMT, single, MLMT, single, ...), on the same Ray session:

* **MLMT step**: B problems → n attempts (LL) → m feedbacks each (HL) → m refinements (LL) → grading → update and
  weight sync of both levels (``--schedule both``, the most expensive case) or of the level whose turn it is under
  the default (tH, tL) = (1, 1) schedule (``--schedule alternate``: HL, LL, HL, ...; use an even ``--steps``).
* **single-model GRPO step**: the LL alone samples as many single-turn responses as the MLMT episode has turns
  (B·n + 2·B·n·m, each with the same token budget as its MLMT counterpart), grades them, and does one GRPO update +
  sync on all of them.

It prints the per-phase times of each variant and the ratio MLMT / single (target ≤ 1.15: orchestration and the
second model add at most 15%). It also times the episode with per-sample concurrency against a turn-by-turn barrier
(all attempts, then all feedbacks, then all refinements).

    python benchmarks/bench_mlmt_step.py --compare levels [--model tiny|smollm2] [--steps 3]

``--compare levels`` (issue 8): on the **same responses** (one episode batch per step), a step that updates both
levels (the default (1, 1) schedule; their log-prob / update / sync calls run concurrently, one driver thread per
level) against a step that updates the LL alone, with ``placement=split``; also the two levels one after the other,
for reference. Each total includes the shared generation and grading time once. Target: both / one ≤ 1.15.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import defaultdict

import numpy as np
import ray

from agent_system.config import compose_config
from agent_system.launcher.main import build_trainer, prepare_config
from agent_system.multi_turn_rollout.episode import EpisodeSettings
from agent_system.prompts.templates import Task
from agent_system.trainer import advantages as adv
from agent_system.trainer.mlmt_trainer import reward_item
from agent_system.trainer.packing import build_rows


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.times[name] += time.perf_counter() - self.start

        return _Span()


def mlmt_step(trainer, step: int, levels: tuple[str, ...] = ("ll", "hl")) -> dict[str, float]:
    timer = Timer()
    with timer("generate"):
        problems = trainer.sampler.next_batch()
        episodes = trainer.rollout(problems, validate=False)
    trainer.rollout_weights.sleep_for_training(list(levels))
    with timer("reward"):
        scores = trainer.score(problems, episodes)
    _, stage = adv.stage_at(trainer.mlmt.stages, step)
    for level in levels:
        with timer("log_prob+advantages"):
            batch = trainer.build_level_batch(level, problems, episodes, scores, stage)
        with timer("update"):
            trainer.update_level(batch)
        with timer("sync"):
            trainer.groups[level].weights_changed()
            trainer.groups[level].wake_up(step)
    return dict(timer.times)


def levels_comparison(trainer, steps: int) -> None:
    """Both levels (concurrent, and sequential) vs the LL alone, on the same episodes, interleaved step by step."""
    variants = {"both (concurrent)": (["ll", "hl"], True), "both (sequential)": (["ll", "hl"], False)}
    variants["LL only"] = (["ll"], True)
    totals: dict[str, list[float]] = {name: [] for name in variants}
    phases: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in variants}
    for step in range(1, steps + 2):  # step 1 is a warm-up
        trainer.global_step = step
        start = time.perf_counter()
        problems = trainer.sampler.next_batch()
        episodes = trainer.rollout(problems, validate=False)  # pushes the previous step's updates
        trainer.rollout_weights.sleep_for_training(["ll", "hl"])
        scores = trainer.score(problems, episodes)
        shared = time.perf_counter() - start
        _, stage = adv.stage_at(trainer.mlmt.stages, step)
        order = list(variants) if step % 2 else list(reversed(variants))
        for name in order:
            levels, concurrent = variants[name]
            timing: dict[str, float] = {}
            start = time.perf_counter()
            trainer.train_levels(levels, problems, episodes, scores, stage, timing, concurrent=concurrent)
            if step > 1:
                totals[name].append(shared + time.perf_counter() - start)
                for key, value in timing.items():
                    phases[name][key].append(value)
                phases[name]["generate+reward (shared)"].append(shared)
    one = statistics.mean(totals["LL only"])
    print(f"{'variant':<20}{'step s':>9}{'ratio to LL only':>18}  phases (mean s)")
    for name in variants:
        mean = statistics.mean(totals[name])
        detail = ", ".join(f"{k} {statistics.mean(v):.2f}" for k, v in sorted(phases[name].items()))
        print(f"{name:<20}{mean:>9.2f}{mean / one:>18.3f}  {detail}")
    both = statistics.mean(totals["both (concurrent)"])
    print(f"ratio both-levels step / one-level step: {both / one:.3f} (target <= 1.15)")


def single_step(trainer, step: int) -> dict[str, float]:
    """Single-model GRPO on the LL with the MLMT step's number of responses and token budgets."""
    config, mlmt, ll = trainer.config, trainer.mlmt, trainer.groups["ll"]
    tokenizer, prompts = trainer.tokenizers["ll"], trainer.runner.prompts
    timer = Timer()
    with timer("generate"):
        problems = trainer.sampler.next_batch()
        tasks = [Task.from_row(row) for row in problems]
        budgets = [config.data.max_response_length] * (1 + 2 * mlmt.m)
        budgets[1 : 1 + mlmt.m] = [config.hl.rollout.response_length] * mlmt.m  # as many tokens as the HL turns
        jobs = [(i, j, budget) for i in range(len(tasks)) for j in range(mlmt.n) for budget in budgets]
        prompt_ids = [prompts.solve(task, tokenizer, config.data.max_prompt_length).ids for task in tasks]

        async def sample():
            temperature = config.actor_rollout_ref.rollout.temperature
            calls = [ll.generate(prompt_ids[i], budget, temperature, f"{i}/{j}") for i, j, budget in jobs]
            return await asyncio.gather(*calls)

        outputs = asyncio.run(sample())
    with timer("reward"):
        items = [
            reward_item(problems[i], tokenizer.decode(o.token_ids, skip_special_tokens=True))
            for (i, _, _), o in zip(jobs, outputs, strict=True)
        ]
        rewards = np.array([r["score"] for r in trainer.reward_pool.score(items)])
    with timer("log_prob+advantages"):
        prompt_rows = [prompt_ids[i] for i, _, _ in jobs]
        batch = build_rows(
            prompt_rows,
            [o.token_ids or [0] for o in outputs],
            tokenizer.pad_token_id,
            [o.log_probs or [0.0] for o in outputs],
        )
        old_log_probs, _ = ll.compute_log_prob(batch)
        batch.batch["old_log_probs"] = old_log_probs
        token_rewards = adv.place_on_last_token(rewards, batch.batch["response_mask"])
        index = np.array([f"p{i}" for i, _, _ in jobs], dtype=object)
        advantages, _ = adv.compute_advantages(
            "grpo", token_rewards, batch.batch["response_mask"], index, config.algorithm
        )
        batch.batch["advantages"] = advantages
    with timer("update"):
        ll.update_actor(batch)
    with timer("sync"):
        ll.weights_changed()
        ll.wake_up(step)
    return dict(timer.times)


def barrier_episode_seconds(trainer, problems) -> float:
    """The same episode with a barrier after every turn (all attempts, then all feedbacks, then all refinements)."""
    runner, settings = trainer.runner, _settings(trainer)

    async def run():
        tasks = [Task.from_row(row) for row in problems]
        owners = [i for i in range(len(tasks)) for _ in range(settings.n)]
        attempts = await asyncio.gather(*[runner.solve(tasks[o], settings, f"{o}/{j}") for j, o in enumerate(owners)])
        executions = await asyncio.gather(
            *[runner.execution_result(tasks[o], a) for o, a in zip(owners, attempts, strict=True)]
        )
        pairs = [(o, a, e) for o, a, e in zip(owners, attempts, executions, strict=True) for _ in range(settings.m)]
        feedbacks = await asyncio.gather(
            *[
                runner._generate(
                    "hl",
                    runner.prompts.feedback(tasks[o], a.text, e, runner.hl_tokenizer, settings.max_prompt_tokens),
                    settings,
                    f"f{k}",
                )
                for k, (o, a, e) in enumerate(pairs)
            ]
        )
        await asyncio.gather(
            *[
                runner._generate(
                    "ll",
                    runner.prompts.refine(tasks[o], a.text, f.text, runner.ll_tokenizer, settings.max_prompt_tokens),
                    settings,
                    f"r{k}",
                )
                for k, ((o, a, _), f) in enumerate(zip(pairs, feedbacks, strict=True))
            ]
        )

    start = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - start


def _settings(trainer) -> EpisodeSettings:
    config = trainer.config
    return EpisodeSettings(
        n=trainer.mlmt.n,
        m=trainer.mlmt.m,
        ll_max_tokens=config.data.max_response_length,
        hl_max_tokens=config.hl.rollout.response_length,
        max_prompt_tokens=config.data.max_prompt_length,
        ll_temperature=1.0,
        hl_temperature=1.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (built offline), smollm2, or a model folder")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up each)")
    parser.add_argument("--batch", type=int, default=2, help="problems per step (B)")
    parser.add_argument("--n", type=int, default=2, help="attempts per problem")
    parser.add_argument("--m", type=int, default=2, help="feedbacks per attempt")
    parser.add_argument("--max-tokens", type=int, default=32, help="LL tokens per turn (HL: 3/4 of it)")
    parser.add_argument(
        "--schedule",
        choices=["both", "alternate"],
        default="both",
        help="both levels updated every MLMT step, or the default alternating (1, 1) schedule (use an even --steps)",
    )
    parser.add_argument(
        "--compare",
        choices=["single", "levels"],
        default="single",
        help="single: MLMT step vs single-model GRPO step; levels: both-levels step vs one-level step (same responses)",
    )
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="bench_mlmt_")
    if args.model == "tiny":
        from agent_system.models.tiny import build_tiny_model

        ll_path, hl_path = build_tiny_model(f"{workdir}/ll", seed=0), build_tiny_model(f"{workdir}/hl", seed=1)
    else:
        ll_path = hl_path = args.model
    overrides = [
        f"actor_rollout_ref.model.path={ll_path}",
        f"hl.model.path={hl_path}",
        f"trainer.default_local_dir={workdir}",
        f"data.train_batch_size={args.batch}",
        f"mlmt.n={args.n}",
        f"mlmt.m={args.m}",
        f"data.max_response_length={args.max_tokens}",
        f"hl.rollout.response_length={max(args.max_tokens * 3 // 4, 1)}",
        "mlmt.dataset.n_train=64",
        "mlmt.dataset.n_val=2",
        "trainer.logger=[console]",
        "mlmt.placement=split",
    ]
    config = prepare_config(compose_config(overrides), overrides)
    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        trainer = build_trainer(config)
        if args.compare == "levels":
            levels_comparison(trainer, args.steps)
            trainer.reward_pool.close()
            return
        results = {"mlmt": [], "single": []}
        for step in range(1, args.steps + 2):  # step 1 of each variant is a warm-up
            # both: both levels every step; alternate: the default (tH, tL) = (1, 1) schedule (HL, LL, HL, ...)
            levels = ("ll", "hl") if args.schedule == "both" else (("ll",) if step % 2 else ("hl",))
            for name in ("mlmt", "single"):
                timing = mlmt_step(trainer, step, levels) if name == "mlmt" else single_step(trainer, step)
                if step > 1:
                    results[name].append(timing)
        pipelined, barrier = [], []
        for _ in range(args.steps):
            problems = trainer.sampler.next_batch()
            start = time.perf_counter()
            trainer.rollout(problems, validate=False)
            pipelined.append(time.perf_counter() - start)
            barrier.append(barrier_episode_seconds(trainer, problems))
        trainer.reward_pool.close()
    finally:
        ray.shutdown()

    phases = ["generate", "reward", "log_prob+advantages", "update", "sync"]
    print(
        f"model={args.model} schedule={args.schedule} B={args.batch} n={args.n} m={args.m} "
        f"max_tokens={args.max_tokens} steps={args.steps} (mean seconds per step)"
    )
    print(f"{'phase':<22}{'MLMT (2 models)':>18}{'single GRPO':>14}")
    totals = {}
    for name in results:
        totals[name] = statistics.mean(sum(t.values()) for t in results[name])
    for phase in phases:
        values = [statistics.mean(t.get(phase, 0.0) for t in results[name]) for name in ("mlmt", "single")]
        print(f"{phase:<22}{values[0]:>18.2f}{values[1]:>14.2f}")
    print(f"{'total':<22}{totals['mlmt']:>18.2f}{totals['single']:>14.2f}")
    print(f"ratio MLMT / single-model step: {totals['mlmt'] / totals['single']:.3f} (target <= 1.15)")
    print(
        f"episode: per-sample pipelining {statistics.median(pipelined):.2f} s vs turn barrier "
        f"{statistics.median(barrier):.2f} s (ratio {statistics.median(pipelined) / statistics.median(barrier):.3f})"
    )


if __name__ == "__main__":
    main()
