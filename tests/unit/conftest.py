"""The unit tier's process: the fast tier's rule (tests/_fast_tier.py: a test that starts a process or reads data
outside the repository is marked ``external``; a bare ``pytest`` leaves it out, and an unmarked one that does either
fails), one OpenMP thread, and the objects each test leaves alive kept out of Python's full collections."""

import gc
import os
import sys

import pytest

# One OpenMP thread per process, as scripts/run_tests.sh sets for every tier on several workers: the unit tests' tensors
# are tiny, and on 2 shared cores a second spinning thread costs more than it computes (test_archer_critic_on_cpu.py
# and test_train_levels_on_cpu.py: 22.5 s of CPU on two threads, 13.2 s on one). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _fast_tier import pytest_collection_modifyitems, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401

_modules_at_last_freeze = 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test that imported modules, collect the young generations and freeze what is alive (``gc.freeze``:
    never scanned again).

    A full collection scans every tracked object, and once torch, verl and vLLM are imported that is millions: 46 full
    collections took 32 s of a bare pytest's 65 s of CPU. With what the imports made frozen, they scan only the
    objects made since. Freezing only after imports keeps the other tests' garbage collectable."""
    global _modules_at_last_freeze
    if len(sys.modules) > _modules_at_last_freeze:
        gc.collect(1)
        gc.freeze()
        _modules_at_last_freeze = len(sys.modules)


def pytest_unconfigure(config):
    """Unfreeze at the end, so the interpreter's last collection frees them (else triton's bindings report leaks)."""
    gc.unfreeze()
