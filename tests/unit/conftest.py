"""The fast tier's rule (tests/_fast_tier.py): a test that starts a process or reads data outside the repository is
marked ``external``; a bare ``pytest`` leaves it out, and an unmarked one that does either fails."""

import os

# One OpenMP thread per process, as scripts/run_tests.sh sets for every tier on several workers: the unit tests' tensors
# are tiny, and on 2 shared cores a second spinning thread costs more than it computes (test_archer_critic_on_cpu.py
# and test_train_levels_on_cpu.py: 22.5 s of CPU on two threads, 13.2 s on one). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _fast_tier import pytest_collection_modifyitems, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401
