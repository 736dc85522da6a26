"""mlmt-configs/submit_mlmt.sbatch gives Ray the allocation's counts and each `srun` its `-c`.

The batch script runs through bash with recording stand-ins for `srun`, `scontrol`, `ray` and the Python (each logs
its argv and exits), and Slurm's variables of a 2-node job with `--cpus-per-task=8 --gpus-per-node=h100:4`. What is
checked is the script's own argument passing (the real Slurm run is tests/integration/test_slurm_sbatch_on_cpu.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1].parent
SCRIPT = REPO / "mlmt-configs" / "submit_mlmt.sbatch"

STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "scontrol show hostnames"*) printf 'n1\\nn2\\n' ;;
  srun*hostname*) echo 10.0.0.1 ;;
  python*)  # the trainer runs while the Ray nodes (started in the background) come up; under load a stand-in that
    # exited at once let the script's clean-up kill a node's `srun` before it logged its call (a flaky count)
    for _ in $(seq 300); do [ "$(grep -c ' start ' "$CALLS")" -ge 2 ] && break; sleep 0.1; done ;;
esac
exit 0
"""


def _run(tmp_path: Path, slurm_env: dict[str, str]) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "ray", "python"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "MLMT_PYTHON": str(bin_dir / "python"),
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "TMPDIR": str(tmp_path),
        **slurm_env,
    }
    result = subprocess.run(["bash", str(SCRIPT), "trainer.total_training_steps=1"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return calls.read_text().splitlines()


def test_ray_gets_the_allocations_cpus_and_gpus_and_srun_its_cpus(tmp_path):
    calls = _run(tmp_path, {"SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_NODE": "h100:4"})
    starts = [call for call in calls if call.startswith("srun") and " start " in call]
    assert len(starts) == 2, calls  # the head and the second node
    for call in starts:
        assert "--cpus-per-task=8" in call and "--num-cpus=8" in call and "--num-gpus=4" in call, call
    assert any(call.startswith("python -m verl.trainer.main_mlmt trainer.nnodes=2") for call in calls), calls


def test_without_slurm_counts_ray_counts_the_node_itself(tmp_path):
    calls = _run(tmp_path, {})
    starts = [call for call in calls if call.startswith("srun") and " start " in call]
    assert len(starts) == 2 and not any("--num-" in call or "--cpus-per-task" in call for call in starts), calls
