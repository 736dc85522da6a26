"""GPU smoke scenarios beyond `bash scripts/gpu_check.sh` (the one-node check a user runs first; docs/GPU_RUN.md).

Each scenario runs `python -m verl.trainer.main_mlmt` (or the evaluator) for two steps on ONE GPU, colocated, with
tiny Qwen2 models built here (agent_system.models.tiny, a different tokenizer per level) and the embedded generated
dataset: nothing is downloaded or read outside the repository. Each appends one JSON line (scenario, passed, seconds,
peak memory per device from `nvidia-smi`, the last lines of output) to $MLMT_GPU_SMOKE_JSONL when it is set
(`bash scripts/gpu_check.sh --smoke` sets it).
Scenarios: one GPU colocated with sleep mode; two GPUs split one per level (skipped on one GPU); `gae` critics; SDPA
without flash-attn; a kill and resume; the evaluator on vLLM in bf16. Marked `gpu` and skipped without CUDA (counted
as not run). Never run on a GPU by this project.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BASE = ["trainer.logger=[console]", "trainer.total_training_steps=2", "trainer.val_before_train=false"]
BASE += ["data.train_batch_size=2", "data.max_prompt_length=768", "data.max_response_length=32"]
BASE += ["hl.rollout.response_length=32", "mlmt.dataset.n_train=16", "mlmt.dataset.n_val=2"]
BASE += ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1"]
SDPA = [
    f"{section}.{key}"
    for section in ("actor_rollout_ref.model", "hl.model", "critic.model", "hl_critic.model")
    for key in ("override_config.attn_implementation=sdpa", "use_remove_padding=false")
]


class PeakMemory:
    """Peak used memory per device (MiB), sampled from `nvidia-smi` every 0.5 s while a scenario runs."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            for line in out.splitlines():
                index, used = (int(part) for part in line.split(","))
                self.peaks[index] = max(self.peaks.get(index, 0), used)
            self._stop.wait(0.5)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()


def _record(name: str, passed: bool, seconds: float, peaks: dict[int, int], output: str) -> None:
    path = os.environ.get("MLMT_GPU_SMOKE_JSONL")
    if path:
        line = {"scenario": name, "passed": passed, "seconds": round(seconds, 1), "peak_mib": peaks}
        with open(path, "a") as handle:
            handle.write(json.dumps({**line, "tail": output[-1500:]}) + "\n")


def _run(name: str, command: list[str], tmp_path: Path, timeout: int = 3600) -> str:
    start = time.monotonic()
    with PeakMemory() as memory:
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, check=False)
    output = result.stdout + result.stderr
    _record(name, result.returncode == 0, time.monotonic() - start, memory.peaks, output)
    assert result.returncode == 0, output[-5000:]
    return output


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Tiny Qwen2 models built here, with a different tokenizer (vocabulary) per level."""
    from agent_system.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {"ll": build_tiny_model(root / "ll", seed=0, vocab_size=512),
            "hl": build_tiny_model(root / "hl", seed=1, vocab_size=640)}  # fmt: skip


def _main(tmp_path: Path, models: dict[str, str], *overrides: str) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_mlmt", f"trainer.default_local_dir={tmp_path / 'run'}", *BASE,
            f"actor_rollout_ref.model.path={models['ll']}", f"hl.model.path={models['hl']}", *overrides]  # fmt: skip


def test_one_gpu_colocated_with_sleep_mode(tmp_path, models):
    overrides = ["actor_rollout_ref.rollout.free_cache_engine=true", "hl.rollout.free_cache_engine=true"]
    _run("one GPU, colocated, sleep mode", _main(tmp_path, models, *overrides), tmp_path)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_split_one_per_level(tmp_path, models):
    overrides = ["mlmt.placement=split", "mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2"]
    _run("two GPUs, split", _main(tmp_path, models, *overrides), tmp_path)


def test_gae_critics(tmp_path, models):
    overrides = ["mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae"]
    _run("gae critics", _main(tmp_path, models, *overrides), tmp_path)


def test_sdpa_without_flash_attn(tmp_path, models):
    # the settings the start-up fallback chooses when flash_attn does not import, set explicitly so they run here too
    overrides = ["mlmt.ll.adv_estimator=gae", *SDPA]
    _run("SDPA, unpacked sequences", _main(tmp_path, models, *overrides), tmp_path)


def test_kill_and_resume(tmp_path, models):
    command = _main(tmp_path, models, "trainer.total_training_steps=3", "trainer.save_freq=1")
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
    lines = []
    for line in process.stdout:  # kill hard once the step-2 checkpoint is being written after step 1's
        lines.append(line)
        if line.startswith("step:2 "):
            os.killpg(process.pid, signal.SIGKILL)
            break
    process.wait()
    assert (tmp_path / "run" / "checkpoints").is_dir(), "".join(lines[-50:])
    output = _run("kill and resume", command, tmp_path)
    assert "resumed from" in output and "step:3 " in output
    _record("kill and resume (both parts)", True, time.monotonic() - start, {}, "")


def test_evaluator_on_vllm_in_bf16(tmp_path, models):
    from agent_system.data.default_dataset import ensure_default_dataset

    _, data = ensure_default_dataset(str(tmp_path / "data"), n_train=2, n_val=8, max_difficulty=1)
    command = [sys.executable, "-m", "agent_system.eval.math500", "--ll", models["ll"], "--hl", models["hl"]]
    command += ["--data", data, "--out", str(tmp_path / "eval"), "--engine", "vllm", "--max-tokens", "32"]
    command += ["--feedback-tokens", "32", "--max-prompt-tokens", "768"]
    _run("evaluator on vLLM (bf16)", command, tmp_path)
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["metrics"]
