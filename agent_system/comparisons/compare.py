"""Compare MLMT and the baselines under one budget, over seeds: train each, export it, evaluate it with the MATH-500
evaluation, then one table (with the budget each baseline got, intervals, paired tests and leak rates) and one plot.

    bash recipes/compare.sh --plan --out compare/plan                                  # the budgets, nothing trains
    bash recipes/compare.sh --out compare/cpu --steps 2 --limit 8 --seeds 2            # CPU: the embedded model
    bash recipes/compare.sh --out compare/gpu --model meta-llama/Llama-3.2-1B-Instruct --steps 500 --batch 32 \\
        --max-tokens 1024 --feedback-tokens 1024 --max-prompt-tokens 4096 --train data/math/train.parquet \\
        --eval-data data/math500/test.parquet --limit 0 --seeds 3
    bash recipes/compare.sh --out compare/cpu --set archer:mlmt.archer.batch_size=4  # one baseline's override

The budget every baseline gets, and what each method's definition fixes: :mod:`agent_system.comparisons.baselines`
and ``recipes/README.md`` ("Like for like"). ``--plan`` writes ``budget.md`` / ``budget.json`` from each baseline's run
plan (the trainer's own) and stops; a comparison writes them too, and ``comparison.md`` opens with the same table.

ArCHer's critic trains ``mlmt.archer.updates_per_step`` updates of ``batch_size`` transitions per step: at the GPU
script's 8 × 64 that is hours per step for a 135M critic on 2 CPU cores; shrink it with ``--set`` on CPU.

Written to ``--out``: ``<baseline>/seed<S>/`` (the run, its ``command.txt``, its export and ``eval/``),
``budget.md`` / ``.json``, ``comparison.md`` / ``.json`` and ``comparison.png``. A rerun continues: a finished training
run is not retrained, a partly trained one resumes from its checkpoint, an evaluation skips the problems it has done.

Stop on request (:class:`StopForwarder`): SIGUSR1 or SIGTERM (Slurm's time-limit warning and preemption,
``recipes/submit_compare.sbatch``) goes on to the running training (SIGUSR1: it finishes its step, writes a checkpoint
and exits 75) or evaluation (SIGTERM: it ends, its finished problems kept); no further run starts and the comparison
exits with 75 (``EX_TEMPFAIL``) and one line; the same command continues it. A training that exits 75 on its own (a
signal sent to it directly) stops the comparison the same way.

Statistics (``comparison.md``): final accuracy is the primary column, as the mean over seeds with its spread (sd,
min–max) and a 95 % interval over problems (of each problem's mean over seeds:
:func:`agent_system.eval.stats.interval`); each baseline against MLMT, the exact paired sign test on the same problems
(each problem's mean over seeds; the exact McNemar test with one seed); the feedback's leak rate where a feedback
writer is evaluated. Turn-1 accuracy, Δ and i→c are marked where a method's objective shapes them (a stage with the
progress bonus α: turn 1 is rewarded for leaving room to improve).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tqdm import tqdm

from agent_system.comparisons.baselines import BASELINES, REPO, Budget, command_line
from agent_system.comparisons.budget import (
    BudgetEntry,
    budget_entry,
    budget_markdown,
    plan_run,
    quiet_logs,
    write_budget,
)
from agent_system.trainer.stop_request import EXIT_STOPPED, STOP_SIGNALS

logger = logging.getLogger(__name__)

SHAPED = ("greedy_acc@t1", "delta_t1_final", "i_to_c")  # columns a progress bonus shapes
OTHER_COLUMNS = ("greedy_acc@t1", "delta_t1_final", "i_to_c", "c_to_i", "solved_any_turn")


def per_baseline_overrides(settings: list[str]) -> dict[str, list[str]]:
    """``--set NAME:KEY=VALUE`` settings as ``{baseline: [KEY=VALUE, ...]}``.

    Raises:
        ValueError: A setting is not ``NAME:KEY=VALUE`` or names no baseline; the message quotes it.
    """
    overrides: dict[str, list[str]] = {}
    for setting in settings:
        name, _, override = setting.partition(":")
        if name not in BASELINES or "=" not in override:
            raise ValueError(f"--set {setting!r}: expected NAME:KEY=VALUE with NAME one of {list(BASELINES)}")
        overrides.setdefault(name, []).append(override)
    return overrides


def training_overlap(args: argparse.Namespace) -> str | None:
    """The evaluation problems that are also training problems of the runs, measured by id and normalised text
    (``agent_system.data.heldout``): a message, or None when the evaluation set is held out.

    The runs train on ``--train``, or on the embedded task the trainer generates from ``mlmt.dataset`` (with the
    ``overrides`` applied); ``--limit`` problems of ``--eval-data`` are evaluated.
    """
    import pandas as pd

    from agent_system.config import compose_config
    from agent_system.data.default_dataset import generate_rows
    from agent_system.data.heldout import ProblemSet, overlap

    if args.train:
        train_rows = pd.read_parquet(args.train).to_dict(orient="records")
    else:
        dataset = compose_config(list(args.overrides)).mlmt.dataset
        train_rows = generate_rows(dataset.n_train, dataset.n_val, dataset.seed, dataset.max_difficulty)[0]
    evaluated = pd.read_parquet(args.eval_data)
    evaluated = evaluated.head(args.limit) if args.limit else evaluated
    found = overlap(evaluated, ProblemSet.of_rows("training", train_rows))
    if not found.either:
        return None
    return (
        f"{found.either} of the {found.rows} evaluated problems of {args.eval_data} are training problems of the runs "
        f"({found.by_id} by id, {found.by_text} by problem text): the table is not held out"
    )


class Stopped(Exception):
    """The comparison stops on request; the message says where. The same command continues it."""


class RunFailed(RuntimeError):
    """A training or an evaluation failed; the message names its log."""


def stopped_on_request(returncode: int, requested: bool) -> bool:
    """Whether a run's exit status means it stopped on a stop request, and that running it again continues it: 75
    (the trainer's :data:`~agent_system.trainer.stop_request.EXIT_STOPPED`, stopped with a checkpoint, whoever asked:
    Slurm's preemption signals every process of the job), or, after a request of the comparison, the end that the
    passed-on signal gives a process without a handler for it (an evaluation, a training still importing): killed by
    SIGUSR1 or SIGTERM, as ``subprocess`` (negative) or a shell (128 + N) reports it."""
    if returncode == EXIT_STOPPED:
        return True
    ended = {-number for number in STOP_SIGNALS} | {128 + number for number in STOP_SIGNALS}
    return requested and returncode in ended


class StopForwarder:
    """SIGUSR1 / SIGTERM stop the comparison: :meth:`run` passes the request on to the run it waits for (the
    signal :meth:`run` was given for it) and starts no run after one came. A second SIGUSR1 is ignored (a warning can
    come twice: Slurm's after a manual ``scancel --signal=USR1``); a second SIGTERM ends the comparison at once, as it
    does the trainer."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        self._child: subprocess.Popen | None = None
        self._child_signal = signal.SIGUSR1
        self._forwarded = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> None:
        """Handle the stop signals (main thread only: elsewhere Python cannot install handlers)."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self.handle)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install` and forget the request."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()
        self.signal_name = None

    def handle(self, number: int, frame=None) -> None:
        name = signal.Signals(number).name
        if self.signal_name == name == "SIGTERM":  # SIGTERM twice: its default action (ends the comparison)
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)
            return
        self.signal_name = self.signal_name or name
        self._forward()

    def _forward(self) -> None:
        """Pass a request on to the running child, once."""
        child = self._child
        if self.requested and child is not None and not self._forwarded:
            self._forwarded = True
            child.send_signal(self._child_signal)  # nothing when it has already exited

    def check(self, what: str) -> None:
        """Stop here if a stop was requested.

        Raises:
            Stopped: A stop was requested; the message names ``what``, what would start now.
        """
        if self.requested:
            raise Stopped(f"{self.signal_name} received before {what}")

    def run(self, command: list[str], log_path: Path, child_signal: signal.Signals, what: str, **popen) -> int:
        """Run ``command`` (its output appended to ``log_path``: a resumed run's log keeps the part before) and
        return its exit status; a stop request, also one that came while it started, is passed on to it as
        ``child_signal``.

        Raises:
            Stopped: A stop was requested before it started (:meth:`check`).
        """
        self.check(what)
        with log_path.open("a") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
            self._forwarded, self._child_signal = False, child_signal
            self._child = process
            try:
                self._forward()  # a request that came while it started
                return process.wait()
            except BaseException:  # as subprocess.run: the child does not outlive an error here
                process.kill()
                process.wait()
                raise
            finally:
                self._child = None


STOPPING = StopForwarder()  # the process's one (signal handlers are per process)


def train(argv: list[str], name: str, run_dir: Path, steps: int) -> float | None:
    """Train baseline ``name`` with ``argv`` (``python -m verl.trainer.main_mlmt``, written to ``command.txt``);
    returns the training's wall-clock minutes.

    A run already trained for ``steps`` is not rerun: its minutes are read back from ``train_minutes.txt`` (None when
    that run was not timed by this script).

    Raises:
        Stopped: It stopped on request (:func:`stopped_on_request`) with a checkpoint it resumes from, or a request
            came before it started.
        RunFailed: The training failed; the message names its log.
    """
    latest = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    timing = run_dir / "train_minutes.txt"
    if latest.is_file() and latest.read_text().strip() == str(steps):
        logger.info("%s: already trained for %d steps (%s)", name, steps, run_dir)
        return float(timing.read_text()) if timing.is_file() else None
    command = [sys.executable, "-m", "verl.trainer.main_mlmt", *argv]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text(shlex.join(command) + "\n")
    timing.unlink(missing_ok=True)  # a partly trained run that resumes is timed from here on
    started = time.perf_counter()
    log_path = run_dir / "train.log"
    what = f"{name}'s training ({run_dir.name})"
    returncode = STOPPING.run(command, log_path, signal.SIGUSR1, what, cwd=REPO)  # the trainer's stop request
    if stopped_on_request(returncode, STOPPING.requested):
        raise Stopped(f"{what} stopped on request (exit {returncode}), resumable from its last checkpoint")
    if returncode != 0:
        raise RunFailed(f"{name}: training failed (exit {returncode}); see {log_path}")
    minutes = (time.perf_counter() - started) / 60
    timing.write_text(f"{minutes:.2f}\n")
    return minutes


def evaluate(args: argparse.Namespace, name: str, run_dir: Path) -> dict:
    """Export the run and evaluate it in the baseline's mode; returns the evaluation's metrics.

    Raises:
        Stopped: The evaluation was ended on request (its finished problems are kept), or a request came before it.
        RunFailed: The evaluation failed; the message names its log.
    """
    from agent_system.launcher.export import export_checkpoint

    what = f"{name}'s evaluation ({run_dir.name})"
    STOPPING.check(what)
    mode = BASELINES[name].mode
    exported = export_checkpoint(str(run_dir), args.steps)
    models = [exported["ll"]]
    if mode == "feedback":
        models.append(exported["hl"])
    elif mode == "frozen_hl":
        models.append(args.model)
    options = ["--self-correct"] if mode == "self_correct" else []
    out = run_dir / "eval"
    command = ["bash", str(REPO / "mlmt-configs/math/eval_math500.sh"), *models, *options, "--out", str(out)]
    command += ["--data", args.eval_data, "--limit", str(args.limit), "--max-tokens", str(args.max_tokens)]
    command += ["--feedback-tokens", str(args.feedback_tokens), "--max-prompt-tokens", str(args.max_prompt_tokens)]
    log_path = run_dir / "eval.log"
    env = {**os.environ, "MLMT_PYTHON": sys.executable}
    returncode = STOPPING.run(command, log_path, signal.SIGTERM, what, env=env, cwd=REPO)  # ends it; it resumes
    if stopped_on_request(returncode, STOPPING.requested):
        raise Stopped(f"{what} stopped on request (exit {returncode}), its finished problems kept")
    if returncode != 0:
        raise RunFailed(f"{name}: evaluation failed (exit {returncode}); see {log_path}")
    return json.loads((out / "summary.json").read_text())["metrics"]


def final_per_problem(eval_dir: Path) -> dict[str, float]:
    """{problem: its final answer's accuracy (the mean over its samples)} of one evaluation's records."""
    from agent_system.eval.math500 import RecordStore

    values = {}
    for record in RecordStore.read(eval_dir / "records.jsonl"):
        samples = record["samples"]
        values[record.get("unique_id") or record["problem"]] = sum(s["correct"][-1] for s in samples) / len(samples)
    return values


@dataclass(frozen=True)
class SeedResult:
    """One trained and evaluated run of a baseline."""

    seed: int
    train_minutes: float | None
    metrics: dict  # the evaluation's metrics (summary.json)
    final: dict[str, float]  # per problem (final_per_problem)


def mean_over_seeds(results: list[SeedResult]) -> dict[str, float]:
    """Each problem's final accuracy averaged over the seeds (problems every seed evaluated)."""
    shared = set.intersection(*(set(r.final) for r in results))
    return {p: sum(r.final[p] for r in results) / len(results) for p in sorted(shared)}


def result_row(name: str, results: list[SeedResult], reference: list[SeedResult] | None, entry: BudgetEntry) -> dict:
    """One baseline's row: final accuracy over seeds (mean, sd, min, max, 95 % interval over problems), the paired
    test against MLMT (``reference``; None for MLMT itself), the leak rate and the other columns' means."""
    from agent_system.eval.stats import interval, paired_sign_test

    finals = [r.metrics["greedy_final_acc"] for r in results]
    problems = mean_over_seeds(results)
    row: dict = {
        "baseline": name,
        "mode": BASELINES[name].mode,
        "seeds": [r.seed for r in results],
        "problems": len(problems),
        "final_acc": statistics.fmean(finals),
        "final_acc_sd": statistics.stdev(finals) if len(finals) > 1 else None,
        "final_acc_min": min(finals),
        "final_acc_max": max(finals),
        "final_acc_ci95": interval(list(problems.values())).as_list(),
        "final_acc_per_seed": finals,
        "turn1_shaped": entry.turn1_shaped,
        "train_minutes": None
        if any(r.train_minutes is None for r in results)
        else sum(r.train_minutes for r in results),
    }
    leaks = [r.metrics.get("leak_rate") for r in results]
    row["leak_rate"] = statistics.fmean(leaks) if None not in leaks else None
    for column in OTHER_COLUMNS:
        row[column] = statistics.fmean(r.metrics[column] for r in results)
    row["vs_mlmt"] = None
    if reference is not None:
        theirs = mean_over_seeds(reference)
        shared = [p for p in problems if p in theirs]
        test = paired_sign_test([theirs[p] for p in shared], [problems[p] for p in shared])
        row["vs_mlmt"] = {
            "shared_problems": test.shared,
            "mlmt_better": test.a_better,
            "baseline_better": test.b_better,
            "p_value": test.p_value,
        }
    return row


def comparison_markdown(rows: list[dict], entries: list[BudgetEntry], args: argparse.Namespace, held_out: str) -> str:
    """``comparison.md``: the budget table, then the results with their statistics."""
    seeds = ", ".join(str(s) for s in args.seed_list)
    lines = [
        f"# MLMT vs baselines: {args.steps} steps × {args.batch} problems, model `{args.model}`, seeds {seeds}, "
        f"evaluated on {rows[0]['problems'] if rows else 0} problems of `{args.eval_data}`",
        "",
        held_out,
        "",
        "## Budget (each baseline's run plan)",
        "",
        budget_markdown(entries),
        "## Results",
        "",
        "| baseline | evaluated as | final acc (mean ± sd over seeds) | 95 % CI | min–max over seeds | "
        "vs MLMT (MLMT better / baseline better, exact p) | leak rate | acc@t1 | Δ t1→final | i→c | c→i | "
        "solved any turn | train min |",
        "|" + "---|" * 13,
    ]
    for row in rows:
        sd = "" if row["final_acc_sd"] is None else f" ± {row['final_acc_sd']:.3f}"
        low, high, _ = row["final_acc_ci95"]
        test = row["vs_mlmt"]
        versus = (
            "–" if test is None else f"{test['mlmt_better']} / {test['baseline_better']}, p = {test['p_value']:.3g}"
        )
        leak = "–" if row["leak_rate"] is None else f"{row['leak_rate']:.3f}"
        mark = " †" if row["turn1_shaped"] else ""
        others = " | ".join(
            f"{row[c]:.3f}{mark if c in SHAPED else ''}" for c in ("greedy_acc@t1", "delta_t1_final", "i_to_c")
        )
        minutes = "–" if row["train_minutes"] is None else f"{row['train_minutes']:.1f}"
        lines.append(
            f"| {row['baseline']} | {row['mode']} | **{row['final_acc']:.3f}**{sd} | [{low:.3f}, {high:.3f}] | "
            f"{row['final_acc_min']:.3f}–{row['final_acc_max']:.3f} | {versus} | {leak} | {others} | "
            f"{row['c_to_i']:.3f} | {row['solved_any_turn']:.3f} | {minutes} |"
        )
    lines += [
        "",
        "Final accuracy is the primary column. † : the method's objective shapes this column (a stage with the "
        "progress bonus α rewards turn 1 for leaving room to improve), so it is not comparable with a method "
        "without one. The 95 % interval is over problems (each problem's mean over seeds); the paired test is the "
        "exact sign test on the same problems (exact McNemar with one seed). Leak rate: the share of evaluated "
        "feedbacks that state the answer (`agent_system.rewards.leak`); – where no feedback writer is evaluated.",
    ]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, rows: list[dict], entries: list[BudgetEntry], args, held_out: str) -> None:
    """comparison.json, comparison.md and comparison.png (final accuracy with its interval, and turn 1, per
    baseline)."""
    settings = {k: v for k, v in vars(args).items() if k != "per_baseline"}
    document = {"settings": settings, "held_out": held_out, "budget": [asdict(e) for e in entries], "rows": rows}
    (out / "comparison.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "comparison.md").write_text(comparison_markdown(rows, entries, args, held_out))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    positions = list(range(len(rows)))
    finals = [r["final_acc"] for r in rows]
    errors = [
        [f - r["final_acc_ci95"][0] for f, r in zip(finals, rows, strict=True)],
        [r["final_acc_ci95"][1] - f for f, r in zip(finals, rows, strict=True)],
    ]
    axis.bar([p - 0.2 for p in positions], [r["greedy_acc@t1"] for r in rows], width=0.4, label="turn 1 (greedy)")
    axis.bar([p + 0.2 for p in positions], finals, width=0.4, yerr=errors, capsize=3, label="final answer (95 % CI)")
    axis.set_xticks(positions, [r["baseline"] for r in rows])
    axis.set(ylabel="accuracy", title=f"{args.steps} training steps, {len(args.seed_list)} seed(s)", ylim=(0, 1))
    axis.legend()
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results folder (runs, evaluations, the comparison)")
    parser.add_argument("--baselines", default=",".join(BASELINES), help=f"comma-separated subset of {list(BASELINES)}")
    parser.add_argument("--plan", action="store_true", help="write budget.md / budget.json and stop (nothing trains)")
    parser.add_argument("--model", default="smollm2", help="initial model of every level (as training takes it)")
    parser.add_argument("--steps", type=int, default=2, help="training steps of every baseline")
    parser.add_argument("--batch", type=int, default=2, help="problems per step")
    parser.add_argument("--n", type=int, default=4, help="attempts per problem (a single-turn baseline: n·(1+m))")
    parser.add_argument("--m", type=int, default=2, help="second turns per attempt (two-turn baselines)")
    parser.add_argument("--lr", type=float, default=5e-7, help="constant lr of every trained policy")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every policy")
    parser.add_argument(
        "--optimizer-steps", type=int, default=1, help="optimizer steps per update of every trained policy and critic"
    )
    parser.add_argument("--train", default=None, help="training parquet (default: the embedded task)")
    parser.add_argument("--eval-data", default="data/math500/test.parquet", help="evaluation parquet")
    parser.add_argument("--limit", type=int, default=8, help="evaluate the first N problems (0: all)")
    parser.add_argument("--max-tokens", type=int, default=64, help="solver tokens per turn (training and eval)")
    parser.add_argument("--feedback-tokens", type=int, default=48, help="feedback tokens per turn (training and eval)")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="prompt budget per turn")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (data order and sampling of every run)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per baseline, seeds --seed, --seed + 1, ...")
    parser.add_argument(
        "--allow-overlap",
        action="store_true",
        help="compare even when evaluated problems are training problems (the table is then marked not held out)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="an override for one baseline's training run (repeatable), e.g. archer:mlmt.archer.batch_size=4",
    )
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every training run (after --)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.baselines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        parser.exit(2, f"error: --baselines: unknown {unknown}; choose from {list(BASELINES)}\n")
    for option in ("steps", "batch", "n", "m", "seeds", "optimizer_steps"):
        if getattr(args, option) < 1:
            parser.exit(2, f"error: --{option.replace('_', '-')} {getattr(args, option)}: use 1 or more\n")
    try:
        args.per_baseline = per_baseline_overrides(args.set)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    args.names = sorted(names, key=lambda name: name != "mlmt")  # MLMT first: the others are tested against it
    args.seed_list = [args.seed + i for i in range(args.seeds)]
    return args


def budget_of(args: argparse.Namespace) -> Budget:
    """The budget the options give (each field of :class:`Budget` is the option of its name)."""
    return Budget(**{field.name: getattr(args, field.name) for field in fields(Budget)})


def stop(message: str) -> None:
    """End the comparison on a user error: one line, exit status 2."""
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def run_dir_of(out: Path, name: str, seed: int) -> Path:
    return out / name / f"seed{seed}"


def plan_baselines(args: argparse.Namespace, out: Path) -> tuple[dict[str, dict[int, list[str]]], list[BudgetEntry]]:
    """Every baseline's command line per seed, and its budget from the first seed's run plan.

    Raises:
        SystemExit: A baseline's config is refused (exit 2, :func:`stop`, the baseline named with the trainer's
            message).
    """
    from agent_system.launcher.main import user_errors

    budget = budget_of(args)
    lines: dict[str, dict[int, list[str]]] = {}
    entries = []
    for name in args.names:
        try:
            with quiet_logs():
                lines[name] = {
                    seed: command_line(
                        name, budget, run_dir_of(out, name, seed), seed, args.overrides, args.per_baseline
                    )
                    for seed in args.seed_list
                }
                config, plan = plan_run(lines[name][args.seed_list[0]])
        except user_errors() as error:
            stop(f"{name}: {error}")
        entries.append(budget_entry(name, config, plan))
    return lines, entries


def main(argv: list[str] | None = None) -> None:
    """The comparison (:func:`run_comparison`). A stop request ends it with one line and exit 75
    (:class:`StopForwarder`); a failed run with one line naming its log and exit 1."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    STOPPING.install()
    try:
        run_comparison(args)
    except Stopped as stopped:
        sys.stderr.write(f"stopped: {stopped}; the same command continues the comparison (exit {EXIT_STOPPED})\n")
        raise SystemExit(EXIT_STOPPED) from None
    except RunFailed as failed:
        sys.stderr.write(f"error: {failed}\n")
        raise SystemExit(1) from None
    finally:
        STOPPING.uninstall()


def run_comparison(args: argparse.Namespace) -> None:
    """Plan, then train, export and evaluate each baseline per seed, writing the table after each baseline."""
    out = Path(args.out).resolve()
    lines, entries = plan_baselines(args, out)
    settings = {k: v for k, v in vars(args).items() if k != "per_baseline"}
    write_budget(out, entries, settings)
    logger.info("budget of each baseline: %s\n%s", out / "budget.md", budget_markdown(entries))
    if args.plan:
        return
    if not Path(args.eval_data).is_file():
        stop(f"--eval-data {args.eval_data} does not exist (agent_system.data.prepare writes it)")
    overlap = training_overlap(args)
    if overlap and not args.allow_overlap:
        stop(f"{overlap}; evaluate on held-out problems, or pass --allow-overlap to compare anyway")
    held_out = f"**Not held out:** {overlap}." if overlap else "The evaluated problems are held out from training."
    results: dict[str, list[SeedResult]] = {}
    rows = []
    for name in tqdm(args.names, desc="baselines", unit="baseline"):
        results[name] = []
        for seed in args.seed_list:
            run_dir = run_dir_of(out, name, seed)
            minutes = train(lines[name][seed], name, run_dir, args.steps)
            summary = evaluate(args, name, run_dir)
            final = final_per_problem(run_dir / "eval")
            results[name].append(SeedResult(seed, minutes, summary, final))
            logger.info("%s seed %d: final accuracy %.3f", name, seed, summary["greedy_final_acc"])
        entry = next(e for e in entries if e.baseline == name)
        reference = results.get("mlmt") if name != "mlmt" else None
        rows.append(result_row(name, results[name], reference, entry))
        write_outputs(out, rows, entries, args, held_out)  # after each baseline: a stopped comparison keeps it
    logger.info("comparison: %s", out / "comparison.md")


if __name__ == "__main__":
    main()
