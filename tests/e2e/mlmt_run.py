"""Run ``python -m verl.trainer.main_mlmt`` in a subprocess and read back its per-step metrics and trajectories."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

# what every toy run on the project's hf server shares: one grading worker, every trajectory written, no validation and
# no checkpoint unless the test sets them; the hf server (a start is ~15 s, vLLM-CPU's 60+): these runs test the
# method, the vLLM path is exercised by the GPU-shaped runs (test_main_mlmt_on_cpu.py)
HF_TOY_RUN = [
    "mlmt.reward.num_workers=1",
    "mlmt.trajectories_per_step=1000",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "actor_rollout_ref.rollout.name=hf",
    "hl.rollout.name=hf",
]


def run_main(out_dir: Path, overrides: list[str], timeout: int = 900) -> dict[int, dict[str, float]]:
    """Train with ``overrides`` (console logger, output in ``out_dir``); returns {step: {metric: value}}."""
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_mlmt",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[console]",
        *overrides,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    # this folder's modules importable by the trainer: the test-side plug-ins (mlmt.plugins=[plugin_...])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(command, cwd=out_dir.parent, env=env, capture_output=True, text=True, timeout=timeout)
    log = result.stdout + result.stderr
    (out_dir.parent / f"{out_dir.name}.log").write_text(log)
    assert result.returncode == 0, log[-6000:]
    return parse_steps(log)


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    steps = {}
    for line in re.findall(r"^step:\d+ .*$", log, re.M):
        pairs = re.findall(r"([\w@/.\-]+):([-+0-9.eE]+|nan|inf)", line)
        values = {k: float(v) for k, v in pairs}
        steps[int(values.pop("step"))] = values
    return steps


def trajectories(out_dir: Path, step: int) -> list[dict]:
    path = out_dir / "trajectories" / f"step_{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
