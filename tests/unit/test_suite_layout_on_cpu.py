"""The test suite's layout: every test file's name is unique.

The suite has no ``__init__.py`` files, so pytest imports each test file as a top-level module named after its file:
two files with the same name in different folders stop the whole collection ("import file mismatch"), which a
clean-clone CI run once hit (tests/unit/trainer and tests/e2e both had test_value_shaping_on_cpu.py).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_names_are_unique():
    folders = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        folders[path.name].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"test files sharing a name (rename one of each): {clashes}"
