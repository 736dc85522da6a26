"""Validation curves of training runs: acc@t1 and final (turn-3) accuracy per validation step, with standard errors.

Reads each run's ``<run>/trajectories/val_step_N.jsonl`` (the trainer writes every validation episode there: greedy,
one attempt and one feedback per problem, so one record per problem) and writes, into ``--out``:

* ``learning_curve.png``: acc@t1 and final accuracy per validation step, one line per run, ±1 standard error;
* ``learning_curve.json`` and ``learning_curve.md``: the same figures per step, the share of turns cut at their token
  budget, and exact paired tests (McNemar, :func:`agent_system.eval.stats.paired_sign_test`) on the shared problems:
  each run's last validation against its first, and each later run against the first run at the last common step.

The standard error of an accuracy p over N problems is sqrt(p (1 − p) / N).

Used by ``bash recipes/learning_demo/run_learning_demo.sh`` (SmolLM2 at both levels against a frozen feedback writer);
on any runs::

    python -m agent_system.comparisons.learning_curve --out DIR --run mlmt=RUN_A --run frozen_hl=RUN_B
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from pathlib import Path

from agent_system.eval.stats import paired_sign_test

logger = logging.getLogger(__name__)

VAL_FILE = re.compile(r"val_step_(\d+)\.jsonl")
TURNS = ("attempt", "feedback", "refinement")


def standard_error(p: float, n: int) -> float:
    """sqrt(p (1 − p) / n): the standard error of a proportion p measured on n independent problems."""
    return math.sqrt(p * (1.0 - p) / n)


def read_validations(run_dir: Path) -> dict[int, list[dict]]:
    """``{step: records}`` of every ``trajectories/val_step_N.jsonl`` of a run, by step.

    Raises:
        FileNotFoundError: The run has no validation file.
        ValueError: A file holds a problem twice (validation writes one record per problem).
    """
    files = {
        int(m.group(1)): p for p in (run_dir / "trajectories").glob("val_step_*.jsonl") if (m := VAL_FILE.match(p.name))
    }
    if not files:
        raise FileNotFoundError(f"{run_dir}/trajectories holds no val_step_N.jsonl")
    steps = {}
    for step, path in sorted(files.items()):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        problems = [r["problem"] for r in records]
        if len(set(problems)) != len(problems):
            raise ValueError(f"{path}: {len(problems) - len(set(problems))} problems appear twice")
        steps[step] = records
    return steps


def summarise(records: list[dict]) -> dict:
    """One validation's figures: problems, acc@t1 and final accuracy (turn 3; turn 1 without a refinement) with
    their standard errors, and the share of each turn cut at its token budget (None when the records do not say)."""
    n = len(records)
    first = sum(r["R1"] for r in records) / n
    final = sum(r.get("R3", r["R1"]) for r in records) / n
    truncated = {}
    for turn in TURNS:
        flags = [r["truncated"][turn] for r in records if r.get("truncated", {}).get(turn) is not None]
        truncated[turn] = sum(flags) / len(flags) if flags else None
    return {
        "problems": n,
        "acc@t1": first,
        "acc@t1_se": standard_error(first, n),
        "final_acc": final,
        "final_acc_se": standard_error(final, n),
        "truncated": truncated,
    }


def _outcomes(records: list[dict], key: str) -> dict[str, float]:
    return {r["problem"]: r.get(key, r["R1"]) for r in records}


def paired(a: list[dict], b: list[dict], key: str) -> dict:
    """The exact paired test of ``key`` (``R1`` or ``R3``) between two validations, on the problems both hold."""
    left, right = _outcomes(a, key), _outcomes(b, key)
    shared = sorted(set(left) & set(right))
    test = paired_sign_test([left[p] for p in shared], [right[p] for p in shared])
    return {"shared": test.shared, "a_better": test.a_better, "b_better": test.b_better, "p_value": test.p_value}


def learning_curves(runs: dict[str, Path]) -> dict:
    """Per run its validation figures by step, and the paired tests (see the module docstring)."""
    validations = {name: read_validations(path) for name, path in runs.items()}
    curves = {name: [{"step": s, **summarise(r)} for s, r in steps.items()] for name, steps in validations.items()}
    tests = []
    for name, steps in validations.items():
        first, last = min(steps), max(steps)
        if first != last:
            for key in ("R1", "R3"):  # "A vs B": A is the first of the pair (a_better: right on A only)
                tests.append({"what": f"{name} step {first} vs step {last}", "key": key,
                              **paired(steps[first], steps[last], key)})  # fmt: skip
    names = list(validations)
    for name in names[1:]:
        common = set(validations[names[0]]) & set(validations[name])
        if common:
            step = max(common)
            for key in ("R1", "R3"):
                tests.append({"what": f"{names[0]} vs {name} at step {step}", "key": key,
                              **paired(validations[names[0]][step], validations[name][step], key)})  # fmt: skip
    return {"runs": {name: str(path) for name, path in runs.items()}, "curves": curves, "paired_tests": tests}


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown(result: dict) -> str:
    """The figures as Markdown: one table row per run and validation step, then the paired tests."""
    lines = [
        "| run | step | problems | acc@t1 ± SE | final acc ± SE | cut: attempt / feedback / refinement |",
        "|---|---|---|---|---|---|",
    ]
    for name, points in result["curves"].items():
        for p in points:
            cut = " / ".join(_share(p["truncated"][turn]) for turn in TURNS)
            lines.append(
                f"| {name} | {p['step']} | {p['problems']} | {p['acc@t1']:.3f} ± {p['acc@t1_se']:.3f} "
                f"| {p['final_acc']:.3f} ± {p['final_acc_se']:.3f} | {cut} |"
            )
    if result["paired_tests"]:
        lines += ["", "| exact paired test (McNemar): A vs B | turn | shared | right on A only | right on B only | p |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for t in result["paired_tests"]:
            turn = "t1" if t["key"] == "R1" else "final"
            lines.append(
                f"| {t['what']} | {turn} | {t['shared']} | {t['a_better']} | {t['b_better']} | {t['p_value']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def panels(count: int, figsize: tuple[float, float]):
    """(figure, axes): ``count`` panels side by side sharing the y axis, on matplotlib's file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, count, figsize=figsize, sharey=True)


def save_panels(fig, axes, path: Path, title: str, ylabel: str) -> None:
    """The curves' finish: whole training steps and a grid on every panel, ``ylabel`` and the runs' legend on the
    first, ``title`` above; saved to ``path`` (PNG, 100 dpi) and closed."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_xlabel("training step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(result: dict, path: Path, title: str) -> None:
    """acc@t1 and final accuracy per validation step, one line per run, ±1 standard-error bars (PNG, 100 dpi)."""
    fig, axes = panels(2, (10, 3.8))
    for axis, key, label in zip(
        axes, ("acc@t1", "final_acc"), ("acc@t1 (attempt)", "final accuracy (turn 3)"), strict=True
    ):
        for offset, (name, points) in enumerate(result["curves"].items()):
            steps = [p["step"] + 0.08 * offset for p in points]  # side by side, so the bars do not hide each other
            axis.errorbar(steps, [p[key] for p in points], yerr=[p[f"{key}_se"] for p in points], marker="o",
                          capsize=3, label=name)  # fmt: skip
        axis.set_title(label)
    save_panels(fig, axes, path, title, "validation accuracy (±1 SE)")


def write_outputs(runs: dict[str, Path], out: Path, title: str) -> dict:
    """learning_curve.{json,md,png} in ``out``; returns the figures."""
    result = learning_curves(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_curve.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "learning_curve.md").write_text(markdown(result))
    plot(result, out / "learning_curve.png", title)
    logger.info("wrote learning_curve.{json,md,png} to %s", out)
    return result


def run_arg(text: str) -> tuple[str, Path]:
    """``--run NAME=RUN_DIR`` parsed (argparse's ``type``)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--run {text!r}: expected NAME=RUN_DIR")
    return name, Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for learning_curve.{json,md,png}")
    parser.add_argument("--run", type=run_arg, action="append", required=True, help="NAME=RUN_DIR (repeatable)")
    parser.add_argument("--title", default="validation accuracy per step", help="the plot's title")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    write_outputs(dict(args.run), args.out, args.title)


if __name__ == "__main__":
    main()
