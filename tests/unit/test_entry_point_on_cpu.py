"""The entry point and the verl plugin: `python -m verl.trainer.main_mlmt` resolves to the repository's shim from
any directory, `import verl` stays the PyPI package, the plugin loads (verl would only log its failure at DEBUG),
the CPU backend is active on this GPU-less machine, and a bad environment fails with one clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.external  # starts python -m verl.trainer.main_mlmt and python -c

REPO = Path(__file__).resolve().parents[2]


def _clean_env(**env: str) -> dict[str, str]:
    """This process's environment without the CPU-backend choice it made, so children detect it themselves."""
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "MLMT_CPU_BACKEND_ANNOUNCED")}
    return {**base, **env}


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, env=_clean_env(**env)
    )


def _main_mlmt(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_mlmt", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(**env),
    )


PROBE = """
import sys, importlib.util
import verl
print("PLUGIN", "agent_system.verl_plugin" in sys.modules)
import agent_system.verl_plugin as plugin
print("LOADED", plugin.LOADED, plugin.CPU_BACKEND_ACTIVE)
print("VERL", verl.__file__)
print("SHIM", importlib.util.find_spec("verl.trainer.main_mlmt").origin)
print("MAIN_PPO", importlib.util.find_spec("verl.trainer.main_ppo").origin)
from verl.utils.device import get_device_name
print("DEVICE", get_device_name())
"""


def _fields(output: str) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in output.splitlines() if " " in line}


def test_names_resolve_from_repo_root_and_elsewhere(tmp_path):
    for cwd in (REPO, tmp_path):
        result = _python(PROBE, cwd)
        assert result.returncode == 0, result.stderr[-3000:]
        fields = _fields(result.stdout)
        assert fields["PLUGIN"] == "True", "import verl did not load the MLMT-RL plugin"
        assert fields["LOADED"] == "True True"
        assert "site-packages" in fields["VERL"] and not fields["VERL"].startswith(str(REPO / "verl"))
        assert fields["SHIM"] == str(REPO / "verl" / "trainer" / "main_mlmt.py")
        assert "site-packages" in fields["MAIN_PPO"]
        assert fields["DEVICE"] == "cpu"
        assert "CPU backend" in result.stderr  # the one log line saying so


def test_no_init_under_repo_verl():
    assert not list((REPO / "verl").rglob("__init__.py"))


def test_help_shows_the_mlmt_keys_with_their_comments_and_folds_verl(tmp_path):
    """Issue 42, point 8: --help was Hydra's 1,860 lines, mostly verl's, without comments, before the CPU overlay."""
    result = _main_mlmt(["--help", "mlmt.n=3"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("usage: python -m verl.trainer.main_mlmt") and len(lines) < 250, len(lines)
    assert "  mlmt.n=3 " in result.stdout and "# attempts per problem (turn 1)" in result.stdout  # override, comment
    assert "  mlmt.reward.num_workers=2 " in result.stdout  # this machine's: the CPU overlay's 2, not the YAML's 8
    assert "CPU (the CPU backend: mlmt-configs/overlays/cpu.yaml applied" in result.stdout
    folded = [line for line in lines if line.startswith("  actor_rollout_ref (")]
    assert len(folded) == 1 and "keys)" in folded[0], folded
    assert not [line for line in lines if line.startswith(("  actor_rollout_ref.", "  trainer."))]  # no verl key


def test_help_all_and_cfg_job_print_this_machines_whole_config(tmp_path):
    import yaml

    full = _main_mlmt(["--help-all"], tmp_path)
    assert full.returncode == 0 and "ppo_mini_batch_size" in full.stdout and len(full.stdout.splitlines()) > 1000
    job = _main_mlmt(["--cfg", "job", "mlmt.m=3"], tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    printed = yaml.safe_load(job.stdout)
    assert printed["mlmt"]["m"] == 3 and printed["data"]["train_batch_size"] == 4  # the CPU overlay's, not 128
    assert printed["actor_rollout_ref"]["rollout"]["dtype"] == "float32"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(
            [],
            {"VERL_PLATFORM": "nvidia"},
            "no GPU is visible and the CPU backend is not active",
            id="gpu-platform-without-gpu",
        ),
        pytest.param(
            ["actor_rollout_ref.model.path=/nonexistent/model"],
            {},
            "actor_rollout_ref.model.path=/nonexistent/model: no such folder",
            id="missing-model-path",
        ),
        pytest.param(
            ["hl.model.path=someorg/somemodel", "data.train_files=data/math/train.parquet"],  # without data: refused
            {"HF_HUB_OFFLINE": "1"},
            "hl.model.path=someorg/somemodel looks like a Hugging Face hub name",
            id="hub-name-offline",
        ),
        pytest.param(["mlmt.m=1"], {}, "mlmt.hl.adv_estimator=grpo groups the m feedbacks", id="invalid-config"),
    ],
)
def test_bad_environment_is_one_clear_error(tmp_path, args, env, message):
    result = _main_mlmt(args, tmp_path, **env)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "main_mlmt: error: " in result.stderr  # the message, not a trace
