"""The unit tier's process: the fast tier's rule (tests/_fast_tier.py: a test that starts a process or reads data
outside the repository is marked ``external``; a bare ``pytest`` leaves it out, and an unmarked one that does either
fails), one OpenMP thread, and the objects each test leaves alive kept out of Python's full collections."""

import gc
import os

import pytest

# One OpenMP thread per process, as scripts/run_tests.sh sets for every tier on several workers: the unit tests' tensors
# are tiny, and on 2 shared cores a second spinning thread costs more than it computes (test_archer_critic_on_cpu.py
# and test_train_levels_on_cpu.py: 22.5 s of CPU on two threads, 13.2 s on one). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _fast_tier import pytest_collection_modifyitems, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test, collect the young generations and freeze what is alive (``gc.freeze``: never scanned again).

    A full collection scans every tracked object, and once torch, verl and vLLM are imported that is millions: 46 full
    collections took 32 s of a bare pytest's 65 s of CPU. Frozen, they scan only what the running test made (4 s).
    What a test leaves alive is still freed by reference counting; only a cycle that becomes garbage after its test
    is never collected (the run's peak memory went from 1.6 to 1.3 GB)."""
    gc.collect(1)
    gc.freeze()
