"""The cross-pair table: every solver (LL) with every feedback writer (HL), and each solver alone, on the same
MATH-500 problems (resumable).

    mlmt-configs/math/eval_math500.sh --matrix LL_A,LL_B --hl HL_A,HL_B,none [options]      # the wrapper users run
    python -m agent_system.eval.matrix --ll LL_A,LL_B --hl HL_A,HL_B,none --data data/math500/test.parquet \\
        --out eval/matrix [--limit N] [--rounds K] [--samples k --temperature 1.0] [--engine vllm|hf] [...]

It answers whether the trained feedback helps and whether it transfers: {trained, base LL} × {trained, frozen HL}.
``--ll`` and ``--hl`` are comma-separated lists of what the evaluator takes (``smollm2``, a Hugging Face folder or
hub name, an export); ``none`` among the HLs is the solver alone (one turn: its final accuracy is its turn-1
accuracy, Δ = i→c = c→i = 0, no leak rate). Every other option is the evaluator's
(``python -m agent_system.eval.math500 --help``) and holds for every pair; ``--rounds`` for the HL columns.

Each pair is one run of :func:`agent_system.eval.math500.evaluate` into ``--out/pairs/<ll>__<hl>/`` (its
``records.jsonl``, ``config.json``, ``summary.json``, ``summary.md``), all on the same ``--data`` and ``--limit``. A
rerun with the same ``--out`` reuses the pairs and problems already recorded (a pair that is done loads no model); a
pair folder written with other settings is refused, naming the keys that differ. A model's name is the last two
parts of its path, as the wrapper names its ``--out`` (``RUN/export/global_step_5/ll`` → ``global_step_5_ll``), with
more parts where two entries would share a name (``A/export/global_step_5/ll`` → ``A_export_global_step_5_ll``). An
empty entry, a model listed twice, a path that is not a model and ``none`` as a solver are refused before anything
is evaluated.

``--out`` then gets the table of every pair, also written to stdout: final accuracy with its 95 % interval, Δ(t1,
final) with its interval, i→c, c→i, the leak rate and the number of problems, all taken from the pairs'
``summary.json``, as ``matrix.md``, ``matrix.json`` and ``matrix.png`` (a heat map of final accuracy, solvers as rows
and feedback writers as columns). See ``docs/EVALUATION.md``, "The cross-pair table".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent_system import log_filter

# agent_system.eval.math500 (it imports torch and transformers) is imported where it is used: the grading workers
# are spawned processes, and each imports this module first.

logger = logging.getLogger(__name__)

NONE = "none"  # as a feedback writer: the solver alone
NAME_PARTS = 2  # a model's name: at least the last two parts of its path, as the wrapper names its --out


class ModelListError(ValueError):
    """A ``--ll`` or ``--hl`` list that cannot be tabulated (the message names the entry)."""


@dataclass(frozen=True)
class Model:
    """One row or column of the table: its name (unique in its list) and the model (None: the solver alone)."""

    name: str
    path: str | None


def _name_parts(entry: str) -> list[str]:
    """The parts of a model's path that may name it, each made safe for a folder name (never ``__`` inside)."""
    parts = [re.sub(r"[^A-Za-z0-9.+-]+", "_", part).strip("._") for part in Path(os.path.expanduser(entry)).parts]
    return [part for part in parts if part] or ["model"]


def unique_names(entries: list[str], flag: str) -> list[str]:
    """The last two parts of each path joined by ``_``, with more parts where two entries would share a name."""
    parts = [_name_parts(entry) for entry in entries]
    depth = [min(NAME_PARTS, len(p)) for p in parts]
    while True:
        names = ["_".join(p[-d:]) for p, d in zip(parts, depth, strict=True)]
        clashing = [i for i, name in enumerate(names) if names.count(name) > 1]
        if not clashing:
            return names
        longer = [i for i in clashing if depth[i] < len(parts[i])]
        if not longer:
            listed = ", ".join(repr(entries[i]) for i in clashing)
            raise ModelListError(f"{flag}: {listed} get the same name {names[clashing[0]]!r}; rename a folder")
        for i in longer:
            depth[i] += 1


def parse_models(value: str | None, flag: str) -> list[Model]:
    """The models of a comma-separated ``--ll`` or ``--hl`` (``none`` allowed among the HLs), with their names."""
    entries = [entry.strip() for entry in (value or "").split(",")]
    if not any(entries):
        raise ModelListError(f"{flag} is empty: give a comma-separated list of models (e.g. {flag} A,B)")
    if not all(entries):
        raise ModelListError(f"{flag} {value}: an entry is empty (two commas, or one at an end)")
    if flag == "--ll" and NONE in entries:
        raise ModelListError(f"--ll {value}: {NONE} is a feedback-writer column (the solver alone), not a solver")
    seen: dict[str, str] = {}
    for entry in entries:
        local = os.path.expanduser(entry)
        key = os.path.realpath(local) if entry != NONE and os.path.exists(local) else os.path.normpath(entry)
        if key in seen:
            twice = f"{entry!r} twice" if seen[key] == entry else f"{seen[key]!r} and {entry!r}, the same model"
            raise ModelListError(f"{flag} {value}: lists {twice}; list each model once")
        seen[key] = entry
    names = unique_names(entries, flag)
    return [Model(name, None if entry == NONE else entry) for name, entry in zip(names, entries, strict=True)]


def pair_folder(out: Path, ll: Model, hl: Model) -> Path:
    return out / "pairs" / f"{ll.name}__{hl.name}"


def pair_args(args: argparse.Namespace, ll: Model, hl: Model) -> argparse.Namespace:
    """The evaluator's arguments of one pair: the shared options, its models and its folder."""
    return argparse.Namespace(
        **{
            **vars(args),
            "ll": ll.path,
            "hl": hl.path,
            "self_correct": False,
            "out": str(pair_folder(Path(args.out), ll, hl)),
            "rounds": args.rounds if hl.path else None,  # the solver alone: one turn
        }
    )


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate what the pair folders do not hold yet, then write and return the table."""
    from agent_system.eval.math500 import Graders, check_model, evaluate

    lls, hls = parse_models(args.ll, "--ll"), parse_models(args.hl, "--hl")
    for level, models in (("ll", lls), ("hl", hls)):  # every path (an adapter's base too), before any pair
        for model in models:
            check_model(argparse.Namespace(**{level: model.path}), level)
    pairs = [(ll, hl) for ll in lls for hl in hls]
    with Graders(args.reward_workers, args.timeout_s) as graders:  # one set of grading workers for every pair
        for number, (ll, hl) in enumerate(pairs, 1):
            logger.info("pair %d of %d: solver %s, feedback %s", number, len(pairs), ll.name, hl.name)
            evaluate(pair_args(args, ll, hl), graders)
    return write_matrix(Path(args.out), lls, hls)


def pair_cell(summary: dict[str, Any]) -> dict[str, Any]:
    """One pair's entry of the table, from its ``summary.json``."""
    metrics = summary["metrics"]
    final = next(name for name in metrics if name.endswith("_final_acc"))
    t1 = next(name for name in metrics if name.endswith("_acc@t1"))
    return {
        "problems": metrics["problems"],
        "rounds": summary["settings"]["rounds"],
        "final_metric": final,
        "final_acc": metrics[final],
        "final_acc_ci95": metrics["ci95"][final],
        "t1_acc": metrics[t1],
        "delta_t1_final": metrics["delta_t1_final"],
        "delta_t1_final_ci95": metrics["ci95"]["delta_t1_final"],
        "i_to_c": metrics["i_to_c"],
        "c_to_i": metrics["c_to_i"],
        "leak_rate": metrics.get("leak_rate"),  # none without feedback
    }


def matrix_table(out: Path, lls: list[Model], hls: list[Model]) -> dict[str, Any]:
    """``matrix.json``: the models and, per pair, its folder and :func:`pair_cell` of its summary."""
    pairs = []
    settings = None
    for ll in lls:
        for hl in hls:
            folder = pair_folder(out, ll, hl)
            summary = json.loads((folder / "summary.json").read_text())
            settings = settings or summary["settings"]
            pairs.append({"ll": ll.name, "hl": hl.name, "folder": str(folder.relative_to(out)), **pair_cell(summary)})
    common = {key: settings[key] for key in ("data", "samples", "temperature", "max_tokens", "feedback_tokens")}
    return {
        "settings": common,
        "solvers": [{"name": m.name, "model": m.path} for m in lls],
        "feedback_writers": [{"name": m.name, "model": m.path} for m in hls],
        "pairs": pairs,
    }


def _with_interval(value: float, ci: list, signed: bool = False) -> str:
    number = f"{value:+.3f}" if signed else f"{value:.3f}"
    return f"{number} [{ci[0]:.2f}, {ci[1]:.2f}]"


MATRIX_NOTE = (
    "Final = the last answer's strict accuracy (`greedy_final_acc`, or `sampled_final_acc` with k > 1 samples or a "
    "temperature, of each pair's `summary.json`), with its 95 % interval; Δ(t1, final) = final − turn 1; i→c / c→i: "
    "wrong at turn 1 and right at the end / the reverse; leak rate: the share of feedbacks stating the answer. "
    f"`{NONE}`: the solver alone, one turn (Δ = i→c = c→i = 0, no feedback to leak)."
)


def matrix_markdown(table: dict[str, Any]) -> str:
    """``matrix.md``: final accuracy as a grid, then every pair's row, then the models behind the names."""
    settings, pairs = table["settings"], table["pairs"]
    columns = [m["name"] for m in table["feedback_writers"]]
    cells = {(p["ll"], p["hl"]): p for p in pairs}
    problems = sorted({p["problems"] for p in pairs})
    lines = [
        "# MATH-500 cross pairs: final accuracy of each solver (row) with each feedback writer (column)",
        "",
        f"Data `{settings['data']}`, {', '.join(map(str, problems))} problems, {settings['samples']} sample(s) per "
        f"problem, temperature {settings['temperature']}, rounds of feedback: "
        + ", ".join(sorted({str(p["rounds"]) for p in pairs if p["hl"] != NONE}) or ["none"])
        + ".",
        "",
        MATRIX_NOTE,
        "",
        "| solver \\ feedback | " + " | ".join(columns) + " |",
        "|---" * (1 + len(columns)) + "|",
    ]
    for solver in table["solvers"]:
        row = [
            _with_interval(cells[solver["name"], c]["final_acc"], cells[solver["name"], c]["final_acc_ci95"])
            for c in columns
        ]
        lines.append(f"| {solver['name']} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Every pair",
        "",
        "| solver | feedback | problems | final [95 %] | Δ(t1, final) [95 %] | i→c | c→i | leak rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        leak = "n/a" if p["leak_rate"] is None else f"{p['leak_rate']:.3f}"
        delta = _with_interval(p["delta_t1_final"], p["delta_t1_final_ci95"], signed=True)
        if p["hl"] == NONE:  # zero by construction: no interval to show
            delta = f"{p['delta_t1_final']:+.3f}"
        lines.append(
            f"| {p['ll']} | {p['hl']} | {p['problems']} | {_with_interval(p['final_acc'], p['final_acc_ci95'])} | "
            f"{delta} | {p['i_to_c']:.3f} | {p['c_to_i']:.3f} | {leak} |"
        )
    lines += ["", "## Models", "", "| role | name | model |", "|---|---|---|"]
    for role, key in (("solver", "solvers"), ("feedback writer", "feedback_writers")):
        lines += [
            f"| {role} | {m['name']} | {'—' if m['model'] is None else '`' + m['model'] + '`'} |" for m in table[key]
        ]
    return "\n".join(lines) + "\n"


def plot_heatmap(table: dict[str, Any], path: Path) -> None:
    """``matrix.png``: final accuracy, solvers as rows and feedback writers as columns, each cell annotated."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [m["name"] for m in table["solvers"]]
    columns = [m["name"] for m in table["feedback_writers"]]
    cells = {(p["ll"], p["hl"]): p for p in table["pairs"]}
    values = np.array([[cells[r, c]["final_acc"] for c in columns] for r in rows])
    longest = max(len(name) for name in rows + columns)
    figure = Figure(figsize=(2.5 + 1.8 * len(columns) + 0.06 * longest, 1.8 + 0.9 * len(rows) + 0.04 * longest))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    axes.set_yticks(range(len(rows)), rows)
    axes.set_xlabel("feedback writer (HL)")
    axes.set_ylabel("solver (LL)")
    for i, r in enumerate(rows):
        for j, c in enumerate(columns):
            low, high = cells[r, c]["final_acc_ci95"][:2]
            text = f"{values[i, j]:.3f}\n[{low:.2f}, {high:.2f}]"
            axes.text(j, i, text, ha="center", va="center", color="black" if values[i, j] > 0.6 else "white")
    problems = "/".join(str(n) for n in sorted({p["problems"] for p in table["pairs"]}))
    axes.set_title(f"MATH-500 final accuracy ({problems} problems)")
    figure.colorbar(image, ax=axes, label="final accuracy")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_matrix(out: Path, lls: list[Model], hls: list[Model]) -> dict[str, Any]:
    """``matrix.json``, ``matrix.md`` and ``matrix.png`` in ``out`` from the pairs' summaries."""
    table = matrix_table(out, lls, hls)
    (out / "matrix.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "matrix.md").write_text(matrix_markdown(table))
    plot_heatmap(table, out / "matrix.png")
    logger.info("cross-pair table: %s, %s, %s", out / "matrix.md", out / "matrix.json", out / "matrix.png")
    return table


def main() -> None:
    from agent_system.eval.math500 import EvalSettingsError, add_run_options

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--ll", help="solvers, comma-separated: smollm2, Hugging Face folders / hub names, exports (required)"
    )
    parser.add_argument(
        "--hl", help="feedback writers, comma-separated (the same forms); none: the solver alone (required)"
    )
    parser.add_argument("--out", help="the table's folder (pairs/<ll>__<hl>/, matrix.md, .json, .png) (required)")
    add_run_options(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log_filter.keep_root_log_level()
    missing = [f"--{name}" for name in ("ll", "hl", "data", "out") if getattr(args, name) is None]
    if missing:
        parser.exit(2, f"error: {', '.join(missing)} required\n")
    try:
        table = run_matrix(args)
    except (ModelListError, EvalSettingsError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    sys.stdout.write(matrix_markdown(table))


if __name__ == "__main__":
    main()
