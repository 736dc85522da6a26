"""A run whose resource pools do not fit the Ray cluster stops at start-up with a message, instead of hanging.

On the CPU backend a device is a rank (one Ray ``CPU`` slot) and the CPU overlay starts Ray with 16 slots, so
``mlmt.ll_gpus=12 mlmt.hl_gpus=12`` asks for 24: verl would wait for the placement group forever (issue 17: still
waiting after 180 s, no message). The run must exit with an error that gives what was asked and what the cluster has.
The subprocess time-out (300 s, most of it imports and the first conversion of the embedded model) only bounds a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_pools_larger_than_the_cluster_fail_at_start_up_with_a_message(tmp_path):
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_mlmt",
        "mlmt.ll_gpus=12",
        "mlmt.hl_gpus=12",
        "mlmt.dataset.n_train=8",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    env.pop("RAY_ADDRESS", None)
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the run was still waiting for its resource pools after 300 s:\n{output[-3000:]}")
    assert process.returncode != 0, output[-3000:]
    assert "do not fit the Ray cluster" in output, output[-3000:]
    assert "LL pool (mlmt.ll_gpus=12): 12 CPU" in output and "HL pool (mlmt.hl_gpus=12): 12 CPU" in output
    assert "in all 24 CPU" in output and ": 16 CPU" in output  # asked, and what the one node has free


def test_each_node_reports_the_paths_it_does_not_see(ray_per_test, tmp_path):
    from agent_system.launcher.gpu_checks import paths_missing_on_nodes

    missing = paths_missing_on_nodes({"seen": str(tmp_path), "unseen": str(tmp_path / "absent")})
    assert list(missing.values()) == [[f"unseen={tmp_path / 'absent'}"]]  # one node (this machine)
