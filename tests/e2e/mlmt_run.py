"""Run ``python -m verl.trainer.main_mlmt`` in a subprocess and read back its per-step metrics and trajectories (the
settings every toy run on the ``hf`` server shares and the readers: agent_system/demos/toy_run.py, which the relay
demo uses too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent_system.demos.toy_run import HF_TOY_RUN, parse_steps, trajectories

__all__ = ["HF_TOY_RUN", "parse_steps", "run_main", "trajectories"]


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
