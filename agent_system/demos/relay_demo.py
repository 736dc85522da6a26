"""The relay demo (``bash recipes/relay_demo/run_relay_demo.sh``): both levels learning on the relay task
(:mod:`agent_system.demos.relay`) in minutes on a CPU, beside a null control. Three steps, each a command:

* ``build --task DIR --seed S``: the task of seed S (golds, both tiny models warmed up and checked, data) in DIR;
  skipped when DIR holds that seed's finished task.
* ``train --task DIR --run RUN --steps N --seed S [--control] [key=value ...]``: one training run through
  ``python -m verl.trainer.main_mlmt`` into the folder RUN (emptied first), its console in ``RUN.log`` and its
  settings in ``RUN.settings.json``; ``--control`` adds the null control (the HL's GRPO on its rewards shuffled
  within each group: :mod:`agent_system.demos.permuted_grpo`); any ``key=value`` replaces or adds a trainer setting.
* ``curve --out DIR --run NAME=RUN ...``: per run and step, the HL's useful-feedback rate, R1, R3 and the solver's
  copy rate (:func:`agent_system.demos.relay.step_series`), written as ``relay_curve.png`` (useful feedback, R3 and the
  copy rate per step, one line per run), ``relay_curve.md`` and ``relay_curve.json`` (the same per step, and per run
  the first three steps' mean against the last three's, as the learning tests count a rise, and the first run's rise
  minus each other run's: on the same seed, what MLMT gained beyond its control).

::

    python -m agent_system.demos.relay_demo build --task outputs/relay_demo/task_seed0 --seed 0
    python -m agent_system.demos.relay_demo train --task outputs/relay_demo/task_seed0 --run outputs/relay_demo/mlmt \\
        --steps 14 --seed 0
    python -m agent_system.demos.relay_demo curve --out outputs/relay_demo --run mlmt=outputs/relay_demo/mlmt
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from agent_system.comparisons.learning_curve import panels, run_arg, save_panels
from agent_system.demos.relay import (
    PERMUTED_CONTROL,
    TASK_FILE,
    build_task,
    built_task,
    passes_gold,
    rises,
    run_overrides,
    second_half,
    step_figures,
    step_series,
    with_overrides,
)
from agent_system.demos.toy_run import parse_steps

logger = logging.getLogger(__name__)

RISE = 0.25  # the learning tests' bound on a rise (last three steps against the first three)
SERIES = {  # the figures plotted per step: key, panel title
    "useful": "HL: useful feedback (its feedback alone is right)",
    "R3": "R3: the refinement is right",
    "copy": "LL: copies useful feedback (R3 = 1 among those rows)",
}


def build(task: Path, seed: int) -> dict[str, str]:
    """The task of ``seed`` in ``task``, built unless it is there already."""
    paths = built_task(task, seed)
    if paths is not None:
        logger.info("the task of seed %d is built already in %s: warm-ups skipped", seed, task)
        return paths
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per load and save of a warm-up's model: noise in the console
    logger.info("building the task of seed %d in %s (two warm-ups of 600 supervised steps)", seed, task)
    paths = build_task(task, seed)
    rates = json.loads((task / TASK_FILE).read_text())
    solver, writer = rates["solver"], rates["writer"]
    logger.info(
        "warm-ups checked: the solver copies the feedback's number with probability %.2f (another code %.3f), the "
        "writer states the code %.2f (another code %.3f)",
        solver["copy"],
        solver["other"],
        writer["gold"],
        writer["other"],
    )
    return paths


def train(task: Path, run: Path, steps: int, seed: int, control: bool, extra: list[str]) -> int:
    """One run of ``steps`` steps on the task in ``task`` into ``run`` (its console in ``run``.log, the trainer's
    settings in ``run``.settings.json); returns the trainer's exit status."""
    paths = built_task(task, seed)
    if paths is None:
        raise SystemExit(f"{task} holds no finished task of seed {seed}: run `build --task {task} --seed {seed}` first")
    shutil.rmtree(run, ignore_errors=True)  # a previous run's later steps must not mix with this one's
    run.parent.mkdir(parents=True, exist_ok=True)
    settings = [
        *run_overrides(paths, steps, seed),
        "trainer.logger=[console]",
        f"trainer.default_local_dir={run}",
        f"trainer.experiment_name=relay_demo_{run.name}",
        *(PERMUTED_CONTROL if control else []),
    ]
    settings = with_overrides(settings, extra)
    (run.parent / f"{run.name}.settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    command = [sys.executable, "-m", "verl.trainer.main_mlmt", *settings]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    log = run.parent / f"{run.name}.log"
    with log.open("w") as handle:
        result = subprocess.run(command, cwd=run.parent, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if result.returncode:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        logger.error("the run %s stopped (exit %d); the end of its console, %s:\n%s", run, result.returncode, log, tail)
    return result.returncode


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def read_run(run: Path) -> dict:
    """A finished run's figures: per step (``steps``), the means of its first and last three steps, the rise of the
    useful-feedback rate and of R3 (and whether each reaches :data:`RISE`), and the solver's right answers without
    help over the second half (pooled)."""
    log = run.parent / f"{run.name}.log"
    metrics = parse_steps(log.read_text())
    if not metrics:
        raise FileNotFoundError(f"{log} has no step line: did the run finish? (its end says why)")
    count = max(metrics)
    series = step_series(run, metrics, count)
    late = second_half(run, count)
    alone = [r["R3"] for r in late if not passes_gold(r["feedback"], r["ground_truth"])]
    first = {key: _mean([s[key] for s in series[:3]]) for key in ("useful", "R1", "R3", "copy")}
    last = {key: _mean([s[key] for s in series[-3:]]) for key in ("useful", "R1", "R3", "copy")}
    return {
        "steps": [{"step": s, **figures} for s, figures in enumerate(series, start=1)],
        "first_three": first,
        "last_three": last,
        "rise": {key: last[key] - first[key] for key in ("useful", "R3")},
        "rises": {key: rises([s[key] for s in series], RISE) for key in ("useful", "R3")},
        "right_unhelped_second_half": {
            "rate": step_figures(late)["right_unhelped"],
            "right": sum(alone),
            "rows": len(alone),
        },
    }


def paired(runs: dict[str, dict]) -> list[dict]:
    """The first run's rise (useful feedback, R3) minus each later run's: on the same seed, task and warm-ups, what
    the first run (MLMT) gained beyond its control. A control's own rise is not zero on this task: the null's
    useful-feedback rate moved by -0.10 to +0.28 over six seeds (docs/MEASUREMENTS.md, "The feedback writer learning
    while the solver learns")."""
    (first, reference), *others = runs.items()
    return [
        {"run": first, "against": name, **{key: reference["rise"][key] - run["rise"][key] for key in ("useful", "R3")}}
        for name, run in others
    ]


def _pair(first: float, last: float) -> str:
    return "–" if math.isnan(first) or math.isnan(last) else f"{first:.2f} → {last:.2f} ({last - first:+.2f})"


def _value(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def markdown(result: dict) -> str:
    """Per run: the first three steps' means against the last three's; the first run's rise above each other's;
    then every step's figures."""
    lines = [
        f"| run | steps | useful feedback, first 3 → last 3 | R3, first 3 → last 3 | rise ≥ {RISE}, the tests' bound "
        "(useful / R3) "
        "| LL copies useful feedback | right unhelped, second half |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in result["runs"].items():
        first, last, unhelped = run["first_three"], run["last_three"], run["right_unhelped_second_half"]
        verdict = " / ".join("yes" if run["rises"][key] else "no" for key in ("useful", "R3"))
        lines.append(
            f"| {name} | {len(run['steps'])} | {_pair(first['useful'], last['useful'])} "
            f"| {_pair(first['R3'], last['R3'])} "
            f"| {verdict} | {_pair(first['copy'], last['copy'])} "
            f"| {_value(unhelped['rate'], 3)} ({unhelped['right']:g} of {unhelped['rows']}) |"
        )
    for pair in result["paired"]:
        lines += ["", f"Paired (same seed, task and warm-ups): {pair['run']}'s rise minus {pair['against']}'s: useful "
                  f"feedback {pair['useful']:+.2f}, R3 {pair['R3']:+.2f}."]  # fmt: skip
    lines += ["", "| run | step | useful feedback | R1 | R3 | LL copies useful feedback | right unhelped |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, run in result["runs"].items():
        for s in run["steps"]:
            figures = " | ".join(_value(s[key]) for key in ("useful", "R1", "R3", "copy", "right_unhelped"))
            lines.append(f"| {name} | {s['step']} | {figures} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path, title: str) -> None:
    """Useful feedback, R3 and the solver's copy rate per training step, one line per run (PNG, 100 dpi)."""
    fig, axes = panels(len(SERIES), (14, 4))
    for axis, (key, label) in zip(axes, SERIES.items(), strict=True):
        for name, run in result["runs"].items():
            axis.plot([s["step"] for s in run["steps"]], [s[key] for s in run["steps"]], marker="o", label=name)
        axis.set(title=label, ylim=(-0.02, 1.02))
    save_panels(fig, axes, path, title, "share of the step's rows")


def write_outputs(runs: dict[str, Path], out: Path, title: str) -> dict:
    """relay_curve.{json,md,png} in ``out``; returns the figures."""
    figures = {name: read_run(run) for name, run in runs.items()}
    result = {"rise_bound": RISE, "runs": figures, "paired": paired(figures)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "relay_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "relay_curve.md").write_text(markdown(result))
    plot(result, out / "relay_curve.png", title)
    logger.info("wrote relay_curve.{json,md,png} to %s", out)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    built = commands.add_parser("build", help="the task of a seed: golds, both warm-ups (checked), data")
    built.add_argument("--task", type=Path, required=True, help="its folder")
    built.add_argument("--seed", type=int, default=0, help="the golds', the warm-ups' and the data order's seed")
    trained = commands.add_parser("train", help="one training run on a built task")
    trained.add_argument("--task", type=Path, required=True, help="the folder `build` wrote")
    trained.add_argument("--run", type=Path, required=True, help="the run's folder (emptied first); console: RUN.log")
    trained.add_argument("--steps", type=int, default=14, help="training steps")
    trained.add_argument("--seed", type=int, default=0, help="the task's seed, also the data order's")
    trained.add_argument("--control", action="store_true", help="the null control: the HL's rewards shuffled")
    trained.add_argument("overrides", nargs="*", help="key=value trainer settings (replace the demo's)")
    curve = commands.add_parser("curve", help="the table and plot of finished runs")
    curve.add_argument("--out", type=Path, required=True, help="folder for relay_curve.{json,md,png}")
    curve.add_argument("--run", type=run_arg, action="append", required=True, help="NAME=RUN_DIR (repeatable)")
    curve.add_argument("--title", default="the relay task: both levels trained, per step", help="the plot's title")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "build":
        build(args.task.resolve(), args.seed)
    elif args.command == "train":
        run = args.run.resolve()
        sys.exit(train(args.task.resolve(), run, args.steps, args.seed, args.control, args.overrides))
    else:
        write_outputs(dict(args.run), args.out, args.title)


if __name__ == "__main__":
    main()
