"""The learning tests' runs on the relay task (issue 34): the task itself, its warm-ups, the trainer's settings of a
run and its per-step figures are agent_system/demos/relay.py (the recipe recipes/relay_demo/ runs the same);
:func:`relay_run` trains on a seed's task through :func:`mlmt_run.run_main` and records what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from mlmt_run import run_main

from agent_system.demos.relay import run_overrides, step_series, with_overrides


def relay_run(out, models: dict[str, str], seed: int, steps: int, extra: list[str], label: str):
    """Train on the relay task (``extra``: more overrides, replacing those of ``run_overrides`` with the same key);
    returns ({step: metrics}, [per-step figures]): the ``step_figures`` of the step's trajectories, its R1 and R3
    (``train/acc@t1``, ``train/acc@t3``), printed with ``label`` and written with it and ``extra`` to
    ``relay_figures.json`` beside ``out`` (the study's figures are read back from there: a pytest-xdist worker's
    prints do not reach the console)."""
    metrics = run_main(out, with_overrides(run_overrides(models, steps, seed), extra))
    figures = step_series(out, metrics, steps)
    for name in ("useful", "R1", "R3", "copy", "right_unhelped"):
        print(f"{label} {name}:", " ".join(f"{f[name]:.2f}" for f in figures))
    record = {"label": label, "seed": seed, "overrides": extra, "figures": figures}
    (Path(out).parent / "relay_figures.json").write_text(json.dumps(record, indent=1))
    return metrics, figures
