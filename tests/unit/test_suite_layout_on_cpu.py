"""The test suite's layout: every test file's name is unique; a bare ``pytest`` runs the unit tier and
scripts/run_tests.sh every tier; no test names a path of one machine.

The suite has no ``__init__.py`` files, so pytest imports each test file as a top-level module named after its file:
two files with the same name in different folders stop the whole collection ("import file mismatch"), which a
clean-clone CI run once hit (tests/unit/trainer and tests/e2e both had test_value_shaping_on_cpu.py).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

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
