"""Planning a GPU run on a machine without one (issue 42, point 4): ``mlmt.plan_only=true mlmt.plan_device=NAME``
plans with the GPU settings (the YAML, not the CPU overlay) and the named device's memory, and says which device it
planned for; a run (no ``plan_only``) and an unknown name are refused by name.

The models are local folders holding only a Qwen2.5-1.5B / Qwen2.5-7B-shaped ``config.json`` (nothing downloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.devices import PLAN_DEVICES
from agent_system.launcher.main import check_config, set_schedule_horizon
from agent_system.launcher.memory_estimate import GIB
from agent_system.launcher.plan import build_plan, render_markdown

REPO = Path(__file__).resolve().parents[3]
QWEN = {"model_type": "qwen2", "num_hidden_layers": 28, "attention_bias": True}
SHAPES = {
    "qwen2.5-1.5b": {**QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen2.5-7b": {**QWEN, "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
}  # fmt: skip
TRAIN_ROWS = 7500


def _models(tmp_path: Path) -> list[str]:
    for name, shape in SHAPES.items():
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(shape))
    return [f"actor_rollout_ref.model.path={tmp_path / 'qwen2.5-1.5b'}", f"hl.model.path={tmp_path / 'qwen2.5-7b'}"]


def _plan(argv: list[str]):
    config = compose_config(argv)
    check_config(config)
    set_schedule_horizon(config, TRAIN_ROWS)
    return config, build_plan(config, TRAIN_ROWS, 500)


def _two_by_eight(tmp_path: Path) -> list[str]:
    """The 2 × 8 reproduction's devices: 8 per level on two nodes of 8."""
    return [*_models(tmp_path), "mlmt.plan_only=true", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
            "mlmt.ll_gpus=8", "mlmt.hl_gpus=8"]  # fmt: skip


def test_plan_device_plans_the_gpu_settings_where_the_same_line_without_it_gets_the_cpu_overlay(tmp_path):
    argv = _two_by_eight(tmp_path)
    cpu_config, cpu_plan = _plan(argv)  # this machine has no GPU: the CPU overlay
    gpu_config, gpu_plan = _plan([*argv, "mlmt.plan_device=h100-80"])
    assert cpu_config.actor_rollout_ref.rollout.dtype == "float32" and cpu_config.data.train_batch_size == 4
    assert cpu_plan.memory.device is None and "CPU" in cpu_plan.device
    assert gpu_config.actor_rollout_ref.rollout.dtype != "float32" and gpu_config.data.train_batch_size == 128
    assert gpu_config.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes is None
    assert gpu_plan.total_steps == 500 and cpu_plan.total_steps == 2
    text = render_markdown(gpu_plan)
    assert "- planned for: NVIDIA H100 80GB (mlmt.plan_device=h100-80, 79.1 GiB)" in text, text
    assert gpu_plan.memory.device == int(79.1 * GIB) and "mlmt.plan_device=h100-80" in gpu_plan.memory.device_source
    ll, hl = gpu_plan.memory.levels["ll"], gpu_plan.memory.levels["hl"]
    assert ll.vllm_weights == 2 * ll.parameters and hl.vllm_weights == 2 * hl.parameters  # bf16 vLLM weights
    assert cpu_plan.memory.levels["ll"].vllm_weights == 4 * ll.parameters  # the overlay's fp32
    assert hl.vllm_budget == int(0.5 * gpu_plan.memory.device)  # verl's gpu_memory_utilization share, not 512 MiB
    assert all(group.fits for group in gpu_plan.memory.sums), text


def test_the_memory_follows_the_named_device(tmp_path):
    argv = [*_two_by_eight(tmp_path), "mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.nnodes=1"]
    sums = {name: _plan([*argv, f"mlmt.plan_device={name}"])[1].memory.sums for name in ("a100-40", "h200-141")}
    assert [group.fits for group in sums["h200-141"]] == [True, True]
    assert not all(group.fits for group in sums["a100-40"])  # a 7B writer on 2 devices of 40 GiB


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mlmt.plan_device=h100-80"], r"mlmt\.plan_device=h100-80 .* only for mlmt\.plan_only=true"),
        (["mlmt.plan_only=true", "mlmt.plan_device=h100"], r"mlmt\.plan_device='h100' is not a known device: use "
         r"one of h100-80, h200-141"),
    ],
)  # fmt: skip
def test_plan_device_is_refused_by_name_in_a_run_or_unknown(argv, message):
    from agent_system.launcher.main import prepare_config

    with pytest.raises(ConfigError, match=message):  # the entry point's checks, before the overlay
        prepare_config(compose_config(argv), argv)


def test_every_device_has_the_memory_torch_reports_below_its_marketed_size():
    for device in PLAN_DEVICES.values():
        marketed = int(device.name.rsplit("-", 1)[1])
        assert 0.9 * marketed < device.gib < marketed, device


@pytest.mark.external  # starts python -m verl.trainer.main_mlmt (no Ray: plan only)
def test_entry_point_plans_a_gpu_run_on_this_machine(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "MLMT_CPU_BACKEND_ANNOUNCED")}
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_mlmt", *_two_by_eight(tmp_path), "mlmt.plan_device=a100-80",
         f"trainer.default_local_dir={out}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads((out / "run_plan.json").read_text())
    assert plan["device"].startswith("NVIDIA A100 80GB (mlmt.plan_device=a100-80, 79.1 GiB)")
    assert plan["memory"]["device"] == int(79.1 * GIB) and plan["total_steps"] == 500
    assert "planned for: NVIDIA A100 80GB" in result.stdout + result.stderr


@pytest.mark.external  # starts python -m verl.trainer.main_mlmt
def test_entry_point_refuses_pools_the_nodes_cannot_hold_before_ray(tmp_path):
    """Issue 42, point 5: 8 + 8 devices on one node of 8 are refused by the plan, by name, not by Ray."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "MLMT_CPU_BACKEND_ANNOUNCED")}
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_mlmt", *_two_by_eight(tmp_path), "trainer.nnodes=1",
         "mlmt.plan_device=h100-80", f"trainer.default_local_dir={out}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0 and not (out / "run_plan.json").exists()
    assert "main_mlmt: error: the run's resource pools do not fit the job's devices (trainer.nnodes=1 × " \
           "trainer.n_gpus_per_node=8)" in result.stderr and "Traceback" not in result.stderr  # fmt: skip
