"""The test suite's layout: every test file's name is unique; a bare ``pytest`` runs the fast unit tier (no test that
starts a process or reads data outside the repository: tests/_fast_tier.py) and scripts/run_tests.sh ruff and every
tier; no test names a path of one machine; deprecations from verl and vLLM are shown.

The suite has no ``__init__.py`` files, so pytest imports each test file as a top-level module named after its file:
two files with the same name in different folders stop the whole collection ("import file mismatch"), which a
clean-clone CI run once hit (tests/unit/trainer and tests/e2e both had test_value_shaping_on_cpu.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def test_test_file_names_are_unique():
    folders = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        folders[path.name].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"test files sharing a name (rename one of each): {clashes}"


def test_a_bare_pytest_runs_the_unit_tier_alone(pytestconfig):
    assert pytestconfig.rootpath == REPO
    assert pytestconfig.getini("testpaths") == ["tests/unit"]


def test_run_tests_runs_every_tier():
    script = (REPO / "scripts" / "run_tests.sh").read_text()
    default_tiers = re.search(r'MLMT_TEST_TIERS:-([^}"]*)', script).group(1).split()
    tiers = [path.name for path in TESTS.iterdir() if path.is_dir() and any(path.rglob("test_*.py"))]
    assert sorted(default_tiers) == sorted(tiers)
    assert default_tiers[0] == "unit"  # the fast tier first


def test_no_machine_path_in_tests():
    """Data beside the repository is found from the test's own path (../shared), never from one machine's."""
    machine_path = re.compile(r"""["'](/work|/home|/root|/Users|/scratch|/mnt)/""")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if machine_path.search(line)
    ]
    assert not found, "tests naming a machine path:\n" + "\n".join(found)


def test_every_unit_test_runs_under_the_fast_tier_guard(pytestconfig):
    import _fast_tier

    unit_conftest = str(TESTS / "unit" / "conftest.py")
    (conftest,) = [p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", "") == unit_conftest]
    for hook in ("pytest_collection_modifyitems", "pytest_runtest_setup", "pytest_runtest_makereport"):
        assert getattr(conftest, hook) is getattr(_fast_tier, hook), hook


_INNER = """
import subprocess, sys

import pytest
from shared_data import SHARED


def test_pure():
    assert sum(range(4)) == 6


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_starts_a_pool():
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(abs, (-1,)) == 1


def test_reads_the_data():
    assert (SHARED / "rows.jsonl").read_text()


def test_imports_a_module_that_starts_a_process(tmp_path, monkeypatch):
    (tmp_path / "probing.py").write_text("import subprocess, sys\\nsubprocess.run([sys.executable, '-c', 'pass'])\\n")
    monkeypatch.syspath_prepend(tmp_path)
    import probing


@pytest.mark.slow(seconds=1)
def test_slow():
    pass


@pytest.mark.external
def test_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert (SHARED / "rows.jsonl").read_text()
"""


@pytest.mark.external
def test_a_bare_pytest_leaves_out_external_tests_and_fails_an_unmarked_one_that_is(tmp_path):
    """A pytest run of its own with tests/_fast_tier.py: what a bare run and a run naming the folder do."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text("{}\n")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_inner.py").write_text(_INNER)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["t"]\nmarkers = ["external", "slow"]\n'
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS), "MLMT_SHARED_DATA": str(tmp_path / "data")}

    def outcomes(*args: str) -> tuple[dict[str, str], str]:
        command = [sys.executable, "-m", "pytest", "-p", "_fast_tier", "-p", "no:cacheprovider", "-rA", *args]
        out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout
        verdicts = re.findall(r"^(PASSED|FAILED) t/test_inner.py::(\w+)", out, re.M)
        return {name: verdict for verdict, name in verdicts}, out

    bare, out = outcomes()
    assert bare == {
        "test_pure": "PASSED",
        "test_starts_a_process": "FAILED",
        "test_starts_a_pool": "FAILED",
        "test_reads_the_data": "FAILED",
        "test_imports_a_module_that_starts_a_process": "PASSED",  # a library's probe on its first import
    }, out
    for said in ["2 deselected", "subprocess.Popen", "multiprocessing.Process.start", "Mark it @pytest.mark.external"]:
        assert said in out, said
    assert f"read {tmp_path / 'data' / 'rows.jsonl'}" in out
    named, out = outcomes("t")
    assert named == {**bare, "test_marked": "PASSED", "test_slow": "PASSED"}, out


@pytest.mark.external
def test_the_learning_study_runs_only_when_named():
    """Tests marked ``study`` (about 25 min) are left out of every run, CI's included, unless ``-m`` names the mark."""
    study = "tests/e2e/test_joint_learning_study_on_cpu.py"

    def collected(*args: str) -> str:
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args, study]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout

    assert re.search(r"no tests collected \((\d+) deselected\)", collected()), collected()
    named = re.search(r"^(\d+) tests collected", collected("-m", "study"), re.M)
    assert named and int(named.group(1)) >= 10, collected("-m", "study")


def test_ruff_runs_in_ci_and_before_a_commit_at_the_pinned_version():
    pinned = re.search(r"^ruff==(\S+)$", (REPO / "requirements" / "constraints-cpu.txt").read_text(), re.M).group(1)
    repos = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
    (ruff,) = [repo for repo in repos if repo["repo"] == "https://github.com/astral-sh/ruff-pre-commit"]
    assert ruff["rev"] == f"v{pinned}"
    assert [hook["id"] for hook in ruff["hooks"]] == ["ruff-check", "ruff-format"]
    script = (REPO / "scripts" / "run_tests.sh").read_text()
    assert script.index(".venv/bin/ruff check .") < script.index(".venv/bin/ruff format --check .") < script.index(
        "for tier in")  # fmt: skip


def test_deprecations_from_verl_and_vllm_are_shown_and_other_packages_are_not():
    """pyproject's filterwarnings (applied to this test too): a verl upgrade's deprecations reach the summary."""
    modules = ["verl.workers.fsdp_workers", "vllm", "agent_system.launcher.main", "torch.nn.modules", "verlx", "xvllm"]
    with warnings.catch_warnings(record=True) as seen:
        for module in modules:
            warnings.warn_explicit(f"deprecated in {module}", DeprecationWarning, "where.py", 1, module=module)
    assert [str(w.message) for w in seen] == [f"deprecated in {module}" for module in modules[:3]]
