"""The fast tier's rule (tests/_fast_tier.py): a test that starts a process or reads data outside the repository is
marked ``external``; a bare ``pytest`` leaves it out, and an unmarked one that does either fails."""

from _fast_tier import pytest_collection_modifyitems, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401
