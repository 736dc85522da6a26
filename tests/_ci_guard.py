"""CI guard (a pytest plugin, registered from tests/conftest.py): the suite's peak memory, and no process outliving
the test that started it.

Memory. A background thread samples, every ``SAMPLE_S`` seconds, the sum of the anonymous resident memory (RssAnon:
heaps, tensors, vLLM's KV cache) of "our" processes: the pytest process and all its descendants, plus the processes a
descendant handed over to init (Ray's raylet and gcs_server outlive a driver that died, vLLM's ``VLLM::EngineCore``
outlives its actor). A process is ours when it was seen in the tree before (pid + start time), when its command line
names a Ray session started by one of ours (``/tmp/ray/session_<date>_<micro>_<driver pid>``) or this session's
pytest ``basetemp``, or when its parent is ours. RssAnon is each process's own memory: the file pages it maps (torch's
libraries in every Ray worker) are shared, and a sum of RSS would count them once per process. It is read from
``/proc/<pid>/statm`` (RSS minus its file-backed and shared pages), about 0.3 ms a process. PSS would split the
shared pages fairly, but costs the kernel a walk of every page table, about 10 ms a process: sampled every 0.5 s, it
took a third to a half of one of the two cores during every integration and e2e test. Memory shared through ``/dev/shm``
(Ray's object store) is in the machine's used memory, printed too.
The terminal summary prints the peak against ``LIMIT_GB`` (``MLMT_TEST_MEMORY_LIMIT_GB``, default 20), flags an
excess (tests do not fail for it), and lists the 5 tests with the highest peaks; the machine's used memory (total -
available, every workload included) is printed too.

Leftovers. An autouse fixture snapshots our processes before each test. After the test (its own fixtures already
torn down) it waits up to ``CLEANUP_WAIT_S`` (``MLMT_TEST_CLEANUP_WAIT_S``, default 60) for every process that the
test started to exit, then terminates and kills the rest, and reports them as a warning. Only processes that are
ours (see above), were created after the test began and do not descend from an older process other than pytest
(the workers of a session-scoped Ray cluster belong to that fixture) are touched; multiprocessing's resource
tracker and forkserver, which live as long as pytest, are left alone.

Under pytest-xdist (``-n N``, every tier in scripts/run_tests.sh) the controller samples memory: its
process tree holds every worker and what they start, so the peak is that of the tests running together (two e2e runs
peak at about 17 GB), and a sample is charged to the test started last. Each worker looks
after the processes of its own tests and hands what it killed to the controller through the test's report, so the
summary lists leftovers from every worker.

Lost workers. When an xdist worker dies in a test (xdist prints only "node down: Not properly terminated"), the
controller reports, in the summary, how its process ended (its exit status, or the signal that killed it) and the
last lines of the Ray driver log of the session it had started (``$RAY_TMPDIR/ray/session_*_<its pid>``, where Ray's
C++ core logs why it ended a driver), then those of the session's GCS server and raylet logs. A driver whose GCS
went away dies without a Python traceback, with exit status 1, 60 s later (``RAY_gcs_rpc_server_reconnect_timeout_s``;
measured with Ray 2.60: ``tests/integration/test_lost_worker_report_on_cpu.py``), and its log only says "GCS may have
been killed ... see the log file gcs_server.out": the GCS's own last lines say whether it crashed (a failed check, a
stack) or stopped mid-work (killed), so the run's output says why.
Then it kills what the dead worker left (its Ray session's servers and actors, vLLM engines, a run it started: its
descendants by the parents the tracker recorded, and the processes of the Ray sessions they started), which would
otherwise hold memory and cores for the rest of the tier, and lists them.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import signal
import threading
import time
import warnings

import psutil
import pytest

GB = 1024**3
LIMIT_GB = float(os.environ.get("MLMT_TEST_MEMORY_LIMIT_GB", "20"))
SAMPLE_S = float(os.environ.get("MLMT_TEST_MEMORY_SAMPLE_S", "0.5"))
CLEANUP_WAIT_S = float(os.environ.get("MLMT_TEST_CLEANUP_WAIT_S", "60"))
KILL_WAIT_S = 10.0
# psutil's create_time is boot time (whole seconds) + start ticks: it may differ from time.time() by up to ~1 s
CLOCK_SLACK_S = 2.0
LOST_WORKER_LOG_LINES = 15
# the logs of a Ray session's servers whose loss ends its driver, read after the driver's own
RAY_SERVER_LOGS = ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err")
RAY_SERVER_LOG_LINES = 8

_RAY_SESSION = re.compile(r"/session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_(\d+)(?=[/\s'\"]|$)")
# children of pytest that live as long as pytest does, by design
_PERSISTENT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch._inductor.compile_worker")

_Key = tuple[int, float]  # (pid, create_time): a process identity that survives pid reuse


class ProcessTracker:
    """Finds the processes of this pytest session and samples their memory."""

    def __init__(self, root_pid: int, basetemp: str | None = None) -> None:
        self.root = root_pid
        self.root_ctime = psutil.Process(root_pid).create_time()
        self.basetemp = basetemp.rstrip("/") if basetemp else None
        self.known: set[_Key] = {(root_pid, self.root_ctime)}
        self.parents: dict[_Key, _Key] = {}  # each process's parent when first seen (kept after the parent died)
        self._cmdlines: dict[_Key, str] = {}
        self._lock = threading.Lock()
        # memory
        self.peak_bytes = 0
        self.peak_test: str | None = None
        self.machine_peak_bytes = 0
        self.machine_total_bytes = psutil.virtual_memory().total
        self.per_test: dict[str, int] = {}
        self.current_test: str | None = None
        self.samples = 0

    def _table(self) -> dict[int, psutil.Process]:
        """Every live, non-zombie process of the machine, by pid (``info`` holds ppid and create_time)."""
        table = {}
        for proc in psutil.process_iter(["ppid", "create_time", "status"]):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["create_time"] is not None:
                table[proc.pid] = proc
        return table

    def _cmdline(self, proc: psutil.Process) -> str:
        """The command line, cached once the process is a few seconds old (a fresh fork may not have exec'd yet)."""
        key = (proc.pid, proc.info["create_time"])
        if key in self._cmdlines:
            return self._cmdlines[key]
        try:
            cmdline = " ".join(proc.cmdline())
        except (psutil.Error, OSError):
            cmdline = ""
        if time.time() - key[1] > 2 * CLOCK_SLACK_S:
            self._cmdlines[key] = cmdline
        return cmdline

    def ours(self, table: dict[int, psutil.Process]) -> set[int]:
        """Pids of this session's processes (see the module docstring); updates the set of known processes."""
        with self._lock:
            seeds = {self.root}
            # drivers of Ray sessions: our processes, unless the pid now belongs to someone else
            known_pids = {
                pid for pid, ctime in self.known if pid not in table or table[pid].info["create_time"] == ctime
            }
            for pid, proc in table.items():
                ctime = proc.info["create_time"]
                if (pid, ctime) in self.known:
                    seeds.add(pid)
                elif ctime >= self.root_ctime:
                    # started during the session outside the tree (orphans, daemons' children): ours only if the
                    # command line says so (read once per process)
                    cmdline = self._cmdline(proc)
                    session = _RAY_SESSION.search(cmdline)
                    if (session and int(session.group(1)) in known_pids) or self._names_basetemp(cmdline):
                        seeds.add(pid)
            children: dict[int, list[int]] = {}
            for pid, proc in table.items():
                children.setdefault(proc.info["ppid"], []).append(pid)
            found, stack = set(), list(seeds)
            while stack:
                pid = stack.pop()
                if pid in found or pid not in table:
                    continue
                found.add(pid)
                stack.extend(children.get(pid, ()))
            for pid in found:
                key, ppid = (pid, table[pid].info["create_time"]), table[pid].info["ppid"]
                if key not in self.known and ppid in table:
                    self.parents[key] = (ppid, table[ppid].info["create_time"])
            self.known.update((pid, table[pid].info["create_time"]) for pid in found)
            if len(self._cmdlines) > 20_000:
                alive = {(pid, proc.info["create_time"]) for pid, proc in table.items()}
                self._cmdlines = {key: value for key, value in self._cmdlines.items() if key in alive}
            return found

    def left_by(self, pid: int) -> list[psutil.Process]:
        """Our live processes that the dead process ``pid`` left: its descendants (by the parents recorded when each
        was first seen, so also those handed over to init), the processes of the Ray sessions it or they started, and
        what those started."""
        table = self._table()
        mine = self.ours(table)
        with self._lock:  # the sampler thread adds to both
            known, parents = set(self.known), dict(self.parents)
        live_ctime = table[pid].info["create_time"] if pid in table else None  # the pid reused meanwhile
        dead = {key for key in known if key[0] == pid and key[1] != live_ctime}

        def descends(key: _Key) -> bool:
            seen = set()
            while key in parents and key not in seen:
                seen.add(key)
                key = parents[key]
                if key in dead:
                    return True
            return False

        family = {p for p in mine if p != self.root and descends((p, table[p].info["create_time"]))}
        drivers = {pid} | family
        for p in mine:
            session = _RAY_SESSION.search(self._cmdline(table[p]))
            if session and int(session.group(1)) in drivers:
                family.add(p)
        children: dict[int, list[int]] = {}
        for p, proc in table.items():
            children.setdefault(proc.info["ppid"], []).append(p)
        stack = list(family)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in family:
                    family.add(child)
                    stack.append(child)
        return [table[p] for p in sorted(family)]

    def _names_basetemp(self, cmdline: str) -> bool:
        if not self.basetemp or self.basetemp not in cmdline:
            return False
        return re.search(re.escape(self.basetemp) + r"(?=[/\s'\"]|$)", cmdline) is not None

    # memory -----------------------------------------------------------------------------------------------------

    def sample(self) -> None:
        table = self._table()
        total = 0
        for pid in self.ours(table):
            try:
                info = table[pid].memory_info()  # /proc/<pid>/statm: "shared" is the file-backed and shmem pages
            except (psutil.Error, OSError):
                continue
            total += max(0, info.rss - info.shared)
        vm = psutil.virtual_memory()
        test = self.current_test
        self.samples += 1
        self.machine_peak_bytes = max(self.machine_peak_bytes, vm.total - vm.available)
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_test = total, test
        if test is not None:
            self.per_test[test] = max(self.per_test.get(test, 0), total)

    # leftovers --------------------------------------------------------------------------------------------------

    def snapshot(self) -> set[_Key]:
        table = self._table()
        return {(pid, table[pid].info["create_time"]) for pid in self.ours(table)}

    def started_since(self, before: set[_Key], since: float) -> list[psutil.Process]:
        """Our live processes that are not in ``before``, were created after ``since`` and descend from no process
        of ``before`` other than pytest itself."""
        table = self._table()
        mine = self.ours(table)
        result = []
        for pid in mine:
            proc = table[pid]
            ctime = proc.info["create_time"]
            if pid == self.root or (pid, ctime) in before or ctime < since - CLOCK_SLACK_S:
                continue
            ancestor, owned_by_older = proc.info["ppid"], False
            while ancestor in table and ancestor not in (self.root, 0, 1):
                if (ancestor, table[ancestor].info["create_time"]) in before:
                    owned_by_older = True
                    break
                ancestor = table[ancestor].info["ppid"]
            if owned_by_older or any(name in self._cmdline(proc) for name in _PERSISTENT):
                continue
            result.append(proc)
        return result


def _describe(procs: list[psutil.Process]) -> str:
    parts = []
    for proc in procs[:12]:
        try:
            name = " ".join(proc.cmdline())[:100] or proc.name()
        except (psutil.Error, OSError):
            name = "?"
        parts.append(f"{proc.pid} {name}")
    more = f" (+{len(procs) - 12} more)" if len(procs) > 12 else ""
    return "; ".join(parts) + more


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (psutil.Error, OSError):
            pass
    return out


def _terminate(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGTERM, then SIGKILL what is left; returns what survived both."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                proc.send_signal(sig)  # psutil checks the create time: a reused pid is never signalled
            except (psutil.Error, OSError):
                pass
        _, procs = psutil.wait_procs(procs, timeout=KILL_WAIT_S / 2)
        procs = _alive(procs)
        if not procs:
            break
    return procs


class _Sampler(threading.Thread):
    def __init__(self, tracker: ProcessTracker) -> None:
        super().__init__(name="mlmt-memory-sampler", daemon=True)
        self.tracker = tracker
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self.tracker.sample()
            except Exception:  # noqa: BLE001 - the sampler must never take the test session down
                pass
            if self.stop.wait(SAMPLE_S):
                return


_STATE: dict = {"tracker": None, "sampler": None, "leftovers": [], "lost_workers": []}
_LEFTOVERS = "mlmt_ci_guard_leftovers"  # the user property a test's teardown report carries its leftovers in


def pytest_sessionstart(session):
    try:
        basetemp = str(session.config._tmp_path_factory.getbasetemp())
    except Exception:  # noqa: BLE001
        basetemp = None
    tracker = ProcessTracker(os.getpid(), basetemp)
    _STATE.update(tracker=tracker, sampler=None, leftovers=[], lost_workers=[])
    if not hasattr(session.config, "workerinput"):  # not an xdist worker: in xdist the controller samples the tree
        _STATE["sampler"] = _Sampler(tracker)
        _STATE["sampler"].start()


def pytest_sessionfinish(session):
    sampler = _STATE.get("sampler")
    if sampler is not None:
        sampler.stop.set()
        sampler.join(timeout=10)
        try:
            sampler.tracker.sample()  # one last sample after the session fixtures were torn down
        except Exception:  # noqa: BLE001
            pass


def pytest_runtest_logstart(nodeid, location):
    """The test a memory sample is charged to; needed in the xdist controller, which runs no test itself."""
    tracker = _STATE.get("tracker")
    if tracker is not None:
        tracker.current_test = nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker went down: when it died (``error`` set), record how (see the module docstring)."""
    if error:
        lines = _lost_worker(node, error)
        popen = _popen(node)
        if popen is not None:  # after reading the logs: the servers' shutdown would add to them
            try:
                lines += _end_what_it_left(popen.pid)
            except Exception as exc:  # noqa: BLE001 - the guard must never take the test session down
                lines.append(f"  what it left could not be killed: {type(exc).__name__}: {exc}")
        _STATE["lost_workers"].append(lines)


def _popen(node):
    """The ``subprocess.Popen`` of an xdist worker (execnet's popen gateway), or None."""
    return getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)


def _lost_worker(node, error) -> list[str]:
    """Lines on a dead xdist worker: its id, how its process ended, the last lines of its Ray driver log and of its
    session's GCS server and raylet logs."""
    popen = _popen(node)
    name = getattr(getattr(node, "gateway", None), "id", "?")
    if popen is None:
        return [f"{name}: {error} (its process is not known)"]
    try:
        status = popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 - still running or not waitable: say so
        status = None
    if status is None:
        ended = "its process had not exited 10 s later"
    elif status < 0:
        ended = f"killed by {signal.Signals(-status).name if -status in signal.valid_signals() else -status}"
    else:
        ended = f"exit status {status}"
    lines = [f"{name} (pid {popen.pid}): {error}; {ended}"]
    ray_root = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray")
    logs = sorted(
        glob.glob(os.path.join(ray_root, f"session_*_{popen.pid}", "logs", f"python-core-driver-*_{popen.pid}.log")),
        key=os.path.getmtime,
    )
    if not logs:
        return [*lines, f"  no Ray driver log of pid {popen.pid} under {ray_root}"]
    lines += _log_tail(logs[-1], LOST_WORKER_LOG_LINES)
    for server_log in RAY_SERVER_LOGS:
        path = os.path.join(os.path.dirname(logs[-1]), server_log)
        # a .out log's records start with "[time"; its periodic stats dumps (indented lines) would fill the tail
        lines += _log_tail(path, RAY_SERVER_LOG_LINES, records_only=server_log.endswith(".out"))
    return lines


def _end_what_it_left(pid: int) -> list[str]:
    """Kills the processes the dead worker ``pid`` left (its Ray session's servers and actors, vLLM engines, a run it
    started), which would hold memory and cores for the rest of the session; a summary line on them."""
    tracker: ProcessTracker | None = _STATE.get("tracker")
    left = tracker.left_by(pid) if tracker is not None else []
    if not left:
        return ["  it left no process behind"]
    description = _describe(left)
    survivors = _terminate(left)
    extra = f"; {len(survivors)} survived SIGKILL: {_describe(survivors)}" if survivors else ""
    return [f"  {len(left)} process(es) it left were killed: {description}{extra}"]


def _log_tail(path: str, count: int, records_only: bool = False) -> list[str]:
    """Summary lines holding the last ``count`` non-blank lines of the log at ``path`` (``records_only``: those that
    start with "["); none when it is missing or has none."""

    def kept(line: str) -> bool:
        return line.startswith("[") if records_only else bool(line.strip())

    try:
        with open(path, errors="replace") as log:
            tail = list(collections.deque((line.rstrip() for line in log if kept(line)), maxlen=count))
    except OSError:
        return []
    if not tail:
        return []
    return [f"  the last {len(tail)} lines of {path}:", *(f"    {line}" for line in tail)]


def pytest_runtest_logreport(report):
    """Collects the leftovers a test's teardown recorded, from this process or from an xdist worker."""
    for name, value in report.user_properties:
        if name == _LEFTOVERS and report.when == "teardown":
            _STATE["leftovers"].append((report.nodeid, *value))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    tracker = _STATE.get("tracker")
    if tracker is not None:
        tracker.current_test = item.nodeid
    try:
        yield
    finally:
        if tracker is not None:
            tracker.current_test = None


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request):
    """Waits for (then kills) the processes this test started; see the module docstring."""
    tracker: ProcessTracker | None = _STATE.get("tracker")
    if tracker is None:
        yield
        return
    since = time.time()
    before = tracker.snapshot()
    yield
    deadline = time.monotonic() + CLEANUP_WAIT_S
    leftovers = tracker.started_since(before, since)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.5)
        leftovers = tracker.started_since(before, since)
    if not leftovers:
        return
    description = _describe(leftovers)
    _shutdown_in_process_ray(leftovers)
    survivors = _terminate(_alive(leftovers))
    request.node.user_properties.append((_LEFTOVERS, (len(leftovers), description, len(survivors))))
    message = (
        f"{len(leftovers)} process(es) started by {request.node.nodeid} were still alive {CLEANUP_WAIT_S:.0f} s "
        f"after it ended and were killed: {description}"
    )
    if survivors:
        message += f"; {len(survivors)} survived SIGKILL: {_describe(survivors)}"
    warnings.warn(pytest.PytestWarning(message), stacklevel=1)


def _shutdown_in_process_ray(leftovers: list[psutil.Process]) -> None:
    """A test that called ``ray.init`` itself and leaked it: shut Ray down cleanly before killing its raylet."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    root = os.getpid()
    for proc in leftovers:
        try:
            if proc.ppid() == root and proc.name() in ("raylet", "gcs_server"):
                ray.shutdown()
                return
        except (psutil.Error, OSError):
            continue


def pytest_terminal_summary(terminalreporter):
    tracker: ProcessTracker | None = _STATE.get("tracker")
    if tracker is None:
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "memory and leftover processes (tests/_ci_guard.py)")
    peak_gb = tracker.peak_bytes / GB
    over = peak_gb > LIMIT_GB
    where = f" during {tracker.peak_test}" if tracker.peak_test else ""
    write(
        f"peak memory: {peak_gb:.1f} GB (limit {LIMIT_GB:g} GB){where} "
        f"[sum of anonymous RSS of pytest's process tree and its Ray/vLLM processes, {tracker.samples} samples "
        f"every {SAMPLE_S:g} s]",
        red=over,
        bold=over,
    )
    if over:
        write(
            f"PEAK MEMORY OVER THE LIMIT: {peak_gb:.1f} GB > {LIMIT_GB:g} GB -- the suite risks Ray's OOM killer "
            "on a 24 GB machine (see the per-test peaks below)",
            red=True,
            bold=True,
        )
    write(
        f"machine used memory peak: {tracker.machine_peak_bytes / GB:.1f} of {tracker.machine_total_bytes / GB:.1f} "
        "GB (total - available, every workload on the machine included)"
    )
    top = sorted(tracker.per_test.items(), key=lambda kv: kv[1], reverse=True)[:5]
    if top:
        write("highest per-test peaks:")
        for nodeid, peak in top:
            write(f"  {peak / GB:5.1f} GB  {nodeid}")
    leftovers = _STATE.get("leftovers") or []
    if leftovers:
        write(f"tests that left processes behind (killed after {CLEANUP_WAIT_S:.0f} s):", yellow=True, bold=True)
        for nodeid, count, description, survived in leftovers:
            extra = f", {survived} survived SIGKILL" if survived else ""
            write(f"  {nodeid}: {count} process(es){extra}: {description}", yellow=True)
    else:
        write("no test left processes behind")
    for lines in _STATE.get("lost_workers") or []:
        write(f"LOST WORKER {lines[0]}", red=True, bold=True)
        for line in lines[1:]:
            write(line, red=True)
