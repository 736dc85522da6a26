"""A Ray worker's output goes to ``<run>/logs/worker-<pid>.log`` (its subprocesses' too), never to the driver's
console, and an exception raised in the worker still reaches the console with the worker's traceback.

A child process stands for the driver (``RunConsole`` + ``start_local_ray`` with the settings of
``agent_system.launcher.console.ray_settings``, as ``main.run_mlmt`` does); its terminal is what a user sees.
Starts a local Ray instance (about 20 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

DRIVER = textwrap.dedent(
    """
    import os, sys
    import ray
    from agent_system.launcher.console import RunConsole, ray_settings
    from agent_system.launcher.main import start_local_ray

    @ray.remote(num_cpus=1)
    class Noisy:
        def __init__(self):
            print("WORKER-NOISE-1 like vLLM's serve arguments", flush=True)
            os.system("echo WORKER-NOISE-2 from a server subprocess")

        def fail_deep_inside(self):
            raise ValueError("worker boom 42")

    with RunConsole(sys.argv[1]) as console:
        init, env = ray_settings(console.log_dir)
        start_local_ray(ray, num_cpus=1, include_dashboard=False, runtime_env=env, **init)
        try:
            actor = Noisy.remote()
            ray.get(actor.fail_deep_inside.remote())
        finally:
            ray.shutdown()
    """
)


def test_worker_output_in_run_logs_and_worker_exception_on_console(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLMT_SHOW_ALL_LOGS": ""}
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    console = result.stdout + result.stderr
    assert result.returncode != 0, console
    # the worker's exception, with the worker's own frame, on the driver's console
    assert "ValueError: worker boom 42" in console and "fail_deep_inside" in console, console
    assert "WORKER-NOISE" not in console, console
    logs = tmp_path / "logs"
    worker_text = "".join(p.read_text(errors="replace") for p in logs.glob("worker-*.log"))
    assert "WORKER-NOISE-1" in worker_text and "WORKER-NOISE-2 from a server subprocess" in worker_text
    assert "worker boom 42" in (logs / "driver.log").read_text()
