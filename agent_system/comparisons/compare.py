"""Compare MLMT and the baselines: each trained for the same steps with the same model, data, seed and lengths through
its own run script, exported, evaluated by the MATH-500 evaluation, then one table and one plot.

    bash recipes/compare.sh --out compare/cpu --steps 2 --limit 8                     # CPU: the embedded model
    bash recipes/compare.sh --out compare/gpu --model meta-llama/Llama-3.2-1B-Instruct --steps 500 --batch 128 \\
        --max-tokens 1024 --max-prompt-tokens 4096 --train data/math/train.parquet --limit 0
    bash recipes/compare.sh --out compare/cpu --set archer:mlmt.archer.batch_size=4  # one baseline's override

ArCHer's critic trains ``mlmt.archer.updates_per_step`` updates of ``batch_size`` transitions per step: at the GPU
script's 8 × 64 that is hours per step for a 135M critic on 2 CPU cores; shrink it with ``--set`` on CPU.

Each baseline runs the very command a user runs (``mlmt-configs/math/*.sh``, ``recipes/*/run_*.sh``) with the budget
overrides appended (they win): model, ``--steps``, ``--batch`` problems per step, lengths, seed, one device per
model; the stage switch (stage I → II) of every run that has one is moved to the middle of the run so both stages
happen. Then ``python -m agent_system.launcher.export`` and ``mlmt-configs/math/eval_math500.sh`` in the mode that fits
the baseline (the solver alone for GRPO, self-correction for SCoRe, the trained or frozen feedback writer otherwise).

Written to ``--out``: ``<baseline>/`` (the run, its export and ``eval/``), ``comparison.md``, ``comparison.json`` and
``comparison.png``. A rerun continues: a finished training run resumes at its last step (nothing to do), a finished
evaluation is read back from its records.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]

# name -> (run script, evaluation mode, whether it has SCoRe-style stages to squeeze into the run, devices (GPUS))
BASELINES = {
    "mlmt": ("mlmt-configs/math/HLT_LLT_GRPO_1_1.sh", "feedback", True, 1),
    "fixed_feedback": ("mlmt-configs/math/HLF_LLT_RR_1_1.sh", "frozen_hl", True, 1),
    "grpo": ("recipes/grpo/run_grpo.sh", "single", False, 1),
    "score": ("recipes/score/run_score.sh", "self_correct", True, 1),
    "rl_guided_score": ("recipes/rl_guided_score/run_rl_guided_score.sh", "feedback", True, 1),
    "value_shaping": ("recipes/value_shaping/run_value_shaping.sh", "feedback", False, 1),
    "archer": ("recipes/archer/run_archer.sh", "single", False, 2),  # one device for the solver, one for the critic
    "reinforce_kl": ("recipes/reinforce_kl/run_reinforce_kl.sh", "single", False, 1),  # on the budget's data
}
COLUMNS = ("greedy_acc@t1", "greedy_final_acc", "delta_t1_final", "i_to_c", "c_to_i", "solved_any_turn")


def budget_overrides(args: argparse.Namespace, run_dir: Path, stages: bool) -> list[str]:
    """The overrides every baseline gets (appended last, so they win over its script's GPU settings)."""
    data = [f"data.train_files={args.train}", f"data.val_files={args.train}"] if args.train else []
    data = data or ["data.train_files=null", "data.val_files=null"]  # the embedded task
    overrides = [
        *data,
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={args.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"data.train_batch_size={args.batch}",
        f"data.max_prompt_length={args.max_prompt_tokens}",
        f"data.max_response_length={args.max_tokens}",
        f"hl.rollout.response_length={args.feedback_tokens}",
        f"data.seed={args.seed}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "hl.actor.ppo_mini_batch_size=16",
    ]
    if stages:  # stage I for the first half, stage II for the rest
        overrides.append(f"mlmt.stages.schedule=[0,{args.steps // 2 + 1}]")
    return overrides


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


def train(args: argparse.Namespace, name: str, run_dir: Path) -> float | None:
    """Run the baseline's script with the budget; returns the training's wall-clock minutes.

    A run already trained for ``--steps`` is not rerun: its minutes are read back from ``train_minutes.txt`` (None
    when that run was not timed by this script).
    """
    script, _, stages, devices = BASELINES[name]
    latest = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    timing = run_dir / "train_minutes.txt"
    if latest.is_file() and latest.read_text().strip() == str(args.steps):
        logger.info("%s: already trained for %d steps (%s)", name, args.steps, run_dir)
        return float(timing.read_text()) if timing.is_file() else None
    env = {**os.environ, "MODEL": args.model, "GPUS": str(devices), "LL_GPUS": "1", "HL_GPUS": "1"}
    env["MLMT_PYTHON"] = sys.executable
    extra = [*args.overrides, *args.per_baseline.get(name, [])]
    command = ["bash", str(REPO / script), *budget_overrides(args, run_dir, stages), *extra]
    run_dir.mkdir(parents=True, exist_ok=True)
    timing.unlink(missing_ok=True)  # a partly trained run that resumes is timed from here on
    started = time.perf_counter()
    with (run_dir.parent / f"{name}.train.log").open("w") as log:
        result = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: training failed (exit {result.returncode}); see {log.name}")
    minutes = (time.perf_counter() - started) / 60
    timing.write_text(f"{minutes:.2f}\n")
    return minutes


def evaluate(args: argparse.Namespace, name: str, run_dir: Path) -> dict:
    """Export the run and evaluate it in the baseline's mode; returns the evaluation's metrics."""
    from agent_system.launcher.export import export_checkpoint

    mode = BASELINES[name][1]
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
    with (run_dir.parent / f"{name}.eval.log").open("w") as log:
        env = {**os.environ, "MLMT_PYTHON": sys.executable}
        result = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: evaluation failed (exit {result.returncode}); see {log.name}")
    return json.loads((out / "summary.json").read_text())["metrics"]


def write_outputs(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    """comparison.json, comparison.md (one row per baseline) and comparison.png (accuracy at turn 1 and final)."""
    (out / "comparison.json").write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=2) + "\n")
    header = "| baseline | evaluated as | train min | " + " | ".join(COLUMNS) + " |"
    lines = [
        f"# MLMT vs baselines: {args.steps} steps × {args.batch} problems, model `{args.model}`, "
        f"evaluated on {rows[0]['problems'] if rows else 0} problems of `{args.eval_data}`",
        "",
        header,
        "|" + "---|" * (3 + len(COLUMNS)),
    ]
    for row in rows:
        values = " | ".join(f"{row[c]:.3f}" for c in COLUMNS)
        minutes = "–" if row["train_minutes"] is None else f"{row['train_minutes']:.1f}"
        lines.append(f"| {row['baseline']} | {row['mode']} | {minutes} | {values} |")
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    positions = range(len(rows))
    axis.bar([p - 0.2 for p in positions], [r["greedy_acc@t1"] for r in rows], width=0.4, label="turn 1 (greedy)")
    axis.bar([p + 0.2 for p in positions], [r["greedy_final_acc"] for r in rows], width=0.4, label="final answer")
    axis.set_xticks(list(positions), [r["baseline"] for r in rows])
    axis.set(ylabel="accuracy", title=f"{args.steps} training steps, {args.eval_data}", ylim=(0, 1))
    axis.legend()
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results folder (runs, evaluations, the comparison)")
    parser.add_argument("--baselines", default=",".join(BASELINES), help=f"comma-separated subset of {list(BASELINES)}")
    parser.add_argument("--model", default="smollm2", help="initial model of every level (as training takes it)")
    parser.add_argument("--steps", type=int, default=2, help="training steps of every baseline")
    parser.add_argument("--batch", type=int, default=2, help="problems per step")
    parser.add_argument("--train", default=None, help="training parquet (default: the embedded task)")
    parser.add_argument("--eval-data", default="data/math500/test.parquet", help="evaluation parquet")
    parser.add_argument("--limit", type=int, default=8, help="evaluate the first N problems (0: all)")
    parser.add_argument("--max-tokens", type=int, default=64, help="solver tokens per turn (training and eval)")
    parser.add_argument("--feedback-tokens", type=int, default=48, help="feedback tokens per turn")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="prompt budget per turn")
    parser.add_argument("--seed", type=int, default=0, help="data.seed of every run")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="an override for one baseline's training run (repeatable), e.g. archer:mlmt.archer.batch_size=4",
    )
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every training run (after --)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = [n.strip() for n in args.baselines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        parser.exit(2, f"error: --baselines: unknown {unknown}; choose from {list(BASELINES)}\n")
    staged = [name for name in names if BASELINES[name][2]]
    if staged and args.steps < 2:
        needs = "which needs --steps 2 or more"
        parser.exit(2, f"error: --steps {args.steps}: {staged} run stage I then stage II, {needs}\n")
    try:
        args.per_baseline = per_baseline_overrides(args.set)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    if not Path(args.eval_data).is_file():
        parser.exit(2, f"error: --eval-data {args.eval_data} does not exist (agent_system.data.preprocess writes it)\n")
    not_held_out = training_overlap(args)
    if not_held_out:
        logger.warning("%s", not_held_out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in tqdm(names, desc="baselines", unit="run"):
        run_dir = out / name
        minutes = train(args, name, run_dir)
        metrics = evaluate(args, name, run_dir)
        rows.append({"baseline": name, "mode": BASELINES[name][1], "train_minutes": minutes, **metrics})
        write_outputs(out, rows, args)  # after each baseline: a stopped comparison keeps what it measured
        logger.info("%s: %s", name, {c: round(metrics[c], 3) for c in COLUMNS})
    logger.info("comparison: %s", out / "comparison.md")


if __name__ == "__main__":
    main()
