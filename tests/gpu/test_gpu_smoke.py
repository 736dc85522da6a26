"""GPU smoke runs: what CI cannot check, in one command on any GPU node (`bash scripts/gpu_smoke.sh`).

Each scenario runs `python -m verl.trainer.main_mlmt` (or the MATH-500 evaluator) with the embedded SmolLM2 (nothing
is downloaded) for two steps, and appends one JSON line (scenario, passed, seconds, peak memory per device from
`nvidia-smi`, the last lines of output) to $MLMT_GPU_SMOKE_JSONL, which the script renders as Markdown. Scenarios:
one GPU colocated with sleep mode; two GPUs split one per level; `gae` critics; SDPA without flash-attn; a kill and
resume; MATH-500 on vLLM in bf16. Marked `gpu` and skipped without CUDA (counted as not run).
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

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MLMT_SHARED_DATA", REPO.parent / "shared" / "data"))
BASE = ["trainer.logger=[console]", "trainer.total_training_steps=2", "trainer.val_before_train=false"]
BASE += ["data.train_batch_size=4", "data.max_prompt_length=1024", "data.max_response_length=256"]
BASE += ["hl.rollout.response_length=128", "mlmt.dataset.n_train=32", "mlmt.dataset.n_val=8"]
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


def _main(tmp_path: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_mlmt", f"trainer.default_local_dir={tmp_path / 'run'}", *BASE,
            *overrides]  # fmt: skip


def test_one_gpu_colocated_with_sleep_mode(tmp_path):
    overrides = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1"]
    overrides += ["actor_rollout_ref.rollout.enable_sleep_mode=true", "hl.rollout.enable_sleep_mode=true"]
    _run("one GPU, colocated, sleep mode", _main(tmp_path, *overrides), tmp_path)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_split_one_per_level(tmp_path):
    overrides = ["mlmt.placement=split", "mlmt.ll_gpus=1", "mlmt.hl_gpus=1", "trainer.n_gpus_per_node=2"]
    _run("two GPUs, split", _main(tmp_path, *overrides), tmp_path)


def test_gae_critics(tmp_path):
    overrides = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1"]
    overrides += ["mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae"]
    _run("gae critics", _main(tmp_path, *overrides), tmp_path)


def test_sdpa_without_flash_attn(tmp_path):
    # the settings the start-up fallback chooses when flash_attn does not import, set explicitly so they run here too
    overrides = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1", "mlmt.ll.adv_estimator=gae", *SDPA]
    _run("SDPA, unpacked sequences", _main(tmp_path, *overrides), tmp_path)


def test_kill_and_resume(tmp_path):
    overrides = ["mlmt.placement=colocated", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=3"]
    command = _main(tmp_path, *overrides, "trainer.save_freq=1")
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


def test_math500_on_vllm_in_bf16(tmp_path):
    from agent_system.data.preprocess import preprocess

    data = tmp_path / "test.parquet"
    preprocess("math500", str(data), input_path=str(SHARED / "math500" / "test.jsonl"), limit=8)
    command = [sys.executable, "-m", "agent_system.eval.math500", "--ll", "smollm2", "--data", str(data)]
    command += ["--out", str(tmp_path / "eval"), "--engine", "vllm", "--max-tokens", "256"]
    _run("MATH-500 on vLLM (bf16)", command, tmp_path)
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["metrics"]
