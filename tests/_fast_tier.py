"""The fast tier, what a bare ``pytest`` runs (a pytest plugin, imported by tests/unit/conftest.py).

A unit test that starts a process (a subprocess, a fork or a multiprocessing pool, a server's socket) or reads the
benchmark data beside the repository (tests/shared_data.py) is marked ``external``; one that computes for many seconds
(a learning test) is marked ``slow(seconds=N)``. A bare ``pytest`` (no path given: pyproject's testpaths) leaves both
out; naming a path, as scripts/run_tests.sh does for each tier, runs them.

An unmarked test that does either fails, naming what it started or read: an audit hook (``sys.addaudithook``) sees
every process start, socket bind and file open of this process while an unmarked test sets up and runs, and
``multiprocessing``'s process start reports to it (its spawn and forkserver starts raise no audit event). A process
started while a module is being imported is left alone: a library probing the machine once, on its first import
(vLLM's import runs ``uname -p`` and ``file`` through the ``platform`` module), in whichever test imports it first.
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys

import pytest
from shared_data import SHARED

# audit events that start a process or a server
_STARTS = {
    *("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "socket.bind"),
    "multiprocessing.Process.start",  # raised by _audited_start below
}
_DATA = os.path.abspath(SHARED) + os.sep

_seen: list[str] | None = None  # what the running unmarked test started or read; None outside one


def _audit(event: str, args: tuple) -> None:
    if _seen is None:
        return
    if event == "open":
        path = args[0]
        if isinstance(path, (str, bytes)) and os.path.abspath(os.fsdecode(path)).startswith(_DATA):
            _seen.append(f"read {os.fsdecode(path)}")
    elif event in _STARTS and not _importing():
        _seen.append(f"{event} {args[:2]!r}"[:300])


def _importing() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


sys.addaudithook(_audit)
_process_start = multiprocessing.process.BaseProcess.start


def _audited_start(process) -> None:
    sys.audit("multiprocessing.Process.start", process.name)
    _process_start(process)


multiprocessing.process.BaseProcess.start = _audited_start


def _left_out(item) -> bool:
    return any(item.get_closest_marker(name) for name in ("external", "slow"))


def pytest_collection_modifyitems(config, items):
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        left_out = [item for item in items if _left_out(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not _left_out(item)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _seen
    _seen = None if item.get_closest_marker("external") else []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    global _seen
    report = yield
    if call.when == "call" and _seen and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is in the fast tier but started a process or read data outside the repository:\n  "
            + "\n  ".join(dict.fromkeys(_seen))
            + "\nMark it @pytest.mark.external (a bare pytest leaves it out, scripts/run_tests.sh runs it) or keep "
            "it in this process (tests/_fast_tier.py)."
        )
    if call.when == "teardown":
        _seen = None
    return report
