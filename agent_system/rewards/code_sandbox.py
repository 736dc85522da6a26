"""Run untrusted candidate code against test asserts in an isolated, resource-limited process.

Isolation layers, outermost first (each one is used when the machine allows it):

1. ``timeout --signal=KILL``: a wall-clock kill that works even if the calling process dies.
2. ``unshare --net --ipc --pid --fork --kill-child --mount-proc``: an empty network namespace (no interface is
   up, not even loopback), a private IPC namespace (System V shared memory, semaphores and message queues vanish
   with it), a private mount namespace, and a private PID namespace, so killing its first process kills every
   descendant, including ones that called ``setsid``; ``/proc`` shows only the sandbox's processes.
3. A filesystem of the run's own (``sandbox_isolation.py``, a first stage that runs as the namespace's root): a fresh
   read-only root (``pivot_root``, the host's root detached) that holds only :func:`filesystem_view` (the
   interpreter's own file, its standard library with ``site-packages`` hidden, the system's shared libraries), bound
   read-only, a few devices and the run's ``/proc``: no home, data, repository, checkpoint or virtual environment.
   The program can write only to a fresh ``tmpfs`` on ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` and on
   the work folder, each at most ``SandboxLimits.tmp_mb`` and ``max_files`` entries. Nothing the program writes
   reaches the host or another run, and nothing outlives the run: the mounts vanish with the mount namespace when
   its last process dies, whatever the program did. This is why they are mounts and not a cleanup afterwards: no
   crash or kill of the trainer can skip them, nothing has to guess which files were the program's, and the sizes
   and file counts are bounded while the program runs. ``HOME`` and ``TMPDIR`` name the work folder.
4. The privileges dropped by the same first stage, which then execs the harness: no new privileges on exec (a
   set-uid program) and, when running as root, a fresh unprivileged uid per run, so RLIMIT_NPROC is enforced and
   counted per sandbox, files outside world-writable directories cannot be written or deleted, and other processes
   cannot be signalled or inspected. In ``userns`` mode the namespace's root keeps no capability and no bounding
   set, so it cannot unmount the private folders.
5. In the child (``sandbox_harness.py``): RLIMIT_AS, RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE,
   no core dumps, stdout/stderr to /dev/null, a Python-level socket block in ``none`` mode (with a network namespace
   there is no network to block), and a per-stage alarm around everything that runs the program's code, describing
   its exceptions included.
6. Here: a scrubbed environment, a bounded parse of the program (:func:`agent_system.rewards.assert_split.
   defined_names`: its size and the parser's depth limits), a capped result stream read against the wall-clock
   deadline and against a per-stage deadline (:func:`_read_events`: it ends what the harness's alarm cannot, C code
   that never returns to the interpreter), messages made printable, and ``killpg(SIGKILL)`` on the whole session.

Not root: the probe in :func:`isolation_mode` takes ``userns`` mode (layers 2 and 3 in a user namespace, the program
as the calling user with no capability left) and logs a warning once. With neither mode, a run raises
:class:`SandboxUnavailable` (the trainer checks at start-up), unless ``SandboxLimits.isolation`` is ``none``
(``mlmt.reward.sandbox=none``): then layers 2 to 4 are gone, the program reads and writes what the calling user can
(docs/CODE_REWARD.md has the table), ``TMPDIR`` and ``HOME`` still name a private work folder (removed afterwards),
but a file written by name to ``/tmp`` or ``/dev/shm`` stays. It is not cleaned up: the program runs as the calling
user then, and its files cannot be told from those of the trainer or of other runs (a cleanup by time or by owner
could delete theirs).

What is compared, and where (:func:`run_tests`): each assert is split (:mod:`agent_system.rewards.assert_split`); only
the program's side of it goes into the sandbox, comes back as plain data, and is compared with the expected side here,
so the program can neither see the expected values nor take part in the comparison (docs/CODE_REWARD.md).
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import random
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent_system.rewards.assert_split import (
    HOLE_PREFIX,
    Converted,
    UnparsableProgram,
    Unverifiable,
    decode_value,
    defined_names,
    evaluate,
    split_test,
)

logger = logging.getLogger(__name__)

_HARNESS_SOURCE = (Path(__file__).with_name("sandbox_harness.py")).read_text()
_ISOLATION_SOURCE = (Path(__file__).with_name("sandbox_isolation.py")).read_text()
# uids handed to sandboxes when running as root: no passwd entry needed, unlikely to collide with real users
_UID_RANGE = (200_000, 260_000)
_SAFE_ENV_KEYS = ("LANG", "LC_ALL")
# the system's shared libraries, where the interpreter's and its extension modules' dependencies lie
_SYSTEM_LIBRARIES = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/etc/ld.so.cache")
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
ABORTED = "time limit exceeded"  # run-level error: a stage went on past its alarm (ended by the harness or here)
_GRACE_S = 1.0  # sandbox_harness._GRACE_S: after a stage's alarm, the time to describe and report its failure


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        timeout_s: Wall-clock limit for the whole run (program + all tests).
        per_test_s: Limit for the program body and for each test separately.
        program_s: Limit for the program body and the setup code alone, when it differs (None: ``per_test_s``).
        memory_mb: RLIMIT_AS of every sandbox process.
        max_processes: RLIMIT_NPROC (processes and threads of the sandbox uid).
        max_file_mb: RLIMIT_FSIZE, the largest file the program may write.
        max_output_bytes: Cap on the result stream read back from the child.
        tmp_mb: Size of each private temporary folder (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``, the
            work folder; ``root`` and ``userns`` modes).
        max_files: Files and folders each private temporary folder may hold.
        isolation: ``isolated`` (the default): namespaces and a filesystem view of the run's own (``root`` or
            ``userns`` mode), :class:`SandboxUnavailable` where the machine offers neither; ``none``: no namespaces,
            the program sees and may change what the calling user can (the trainer's ``mlmt.reward.sandbox``).
    """

    timeout_s: float = 12.0
    per_test_s: float = 6.0
    memory_mb: int = 512
    max_processes: int = 8
    max_file_mb: int = 16
    max_output_bytes: int = 1_000_000
    program_s: float | None = None
    tmp_mb: int = 16
    max_files: int = 256
    isolation: str = "isolated"

    @classmethod
    def within(cls, timeout_s: float, isolation: str = "isolated") -> SandboxLimits:
        """Limits that end a run inside an outer wall-clock limit of ``timeout_s`` (the reward pool's per item)."""
        return cls(timeout_s=max(0.5, timeout_s - 1.0), per_test_s=max(0.5, min(6.0, timeout_s - 1.0)),
                   isolation=isolation)  # fmt: skip


@dataclass
class SandboxResult:
    """Outcome of :func:`run_tests`.

    Attributes:
        passed: One bool per test, in order.
        first_failure: Message of the first failing test (or of the program error), else None.
        error: Run-level problem (``"timeout"``, ``"program error"``, ``"exited early"``, ...), else None.
        duration_s: Wall-clock seconds of the run.
        outcomes: Per test: ``"passed"``, ``"failed"`` (false, or an exception), ``"unverifiable result"`` (the
            program's side of the assert is not plain data) or ``"not run"`` (the program failed or exited first).
        whole: Per test, True when it could not be split and ran whole in the sandbox.
    """

    passed: list[bool] = field(default_factory=list)
    first_failure: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    outcomes: list[str] = field(default_factory=list)
    whole: list[bool] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


class SandboxUnavailable(RuntimeError):
    """The machine offers no isolated sandbox run and ``mlmt.reward.sandbox=none`` was not chosen."""


@functools.lru_cache(maxsize=2)
def isolation_mode(isolation: str = "isolated") -> str:
    """The mode of this process's sandbox runs: the strongest this machine allows (probed once per process, with an
    empty program), or ``none`` when ``isolation`` asks for it.

    Args:
        isolation: ``isolated`` or ``none`` (:attr:`SandboxLimits.isolation`).

    Returns:
        ``"root"`` (namespaces, filesystem view, per-run uid), ``"userns"`` (namespaces and filesystem view as the
        calling user) or ``"none"``.

    Raises:
        SandboxUnavailable: ``isolated`` on a machine where neither mode runs.
    """
    if isolation == "none":
        logger.warning("code sandbox: mlmt.reward.sandbox=none, programs see and may change the trainer's files")
        return "none"
    if isolation != "isolated":
        raise ValueError(f"code sandbox: isolation={isolation!r}, expected 'isolated' or 'none'")
    if shutil.which("unshare") is None:
        reason = "no unshare command (util-linux)"
    elif os.geteuid() == 0 and _probe("root"):
        return "root"
    elif _probe("userns"):
        logger.warning("code sandbox: not root, running candidates as the calling user (see docs/CODE_REWARD.md)")
        return "userns"
    else:
        reason = "unshare --user --map-root-user failed (user namespaces off: sysctl user.max_user_namespaces, " \
                 "kernel.unprivileged_userns_clone or kernel.apparmor_restrict_unprivileged_userns, or a seccomp " \
                 "policy)"  # fmt: skip
    raise SandboxUnavailable(
        f"code sandbox: no isolated run on this machine ({reason}); mlmt.reward.sandbox=none grades code without "
        "isolation, the programs then read and write what the trainer's user can (docs/CODE_REWARD.md)"
    )


@functools.lru_cache(maxsize=1)
def filesystem_view() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a program sees of the host in ``root`` and ``userns`` modes, each read-only at its own path.

    Returns:
        ``(view, hidden)``: ``view`` the interpreter's real file (not a virtual environment's link to it), its
        standard library and ``LIBDIR`` (its shared library), the system's shared-library folders (links such as
        ``/lib -> usr/lib`` as links) and the dynamic linker's cache; ``hidden`` the ``site-packages`` and
        ``dist-packages`` folders inside them, which the run sees empty.
    """
    libdir = sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED") else None
    own = [os.path.realpath(path) for path in (sys.executable, os.path.dirname(os.__file__), libdir) if path]
    links = [path for path in _SYSTEM_LIBRARIES if os.path.islink(path)]
    folders: list[str] = []
    for path in sorted({*own, *(p for p in _SYSTEM_LIBRARIES if os.path.exists(p) and p not in links)}, key=len):
        if not any(path.startswith(folder + "/") for folder in folders):  # under a bound folder: bound with it
            folders.append(path)
    patterns = ("python3*/site-packages", "python3*/dist-packages", "python3/dist-packages", "site-packages")
    hidden = sorted({found for folder in folders for pattern in patterns for found in glob.glob(f"{folder}/{pattern}")})
    return tuple(folders + links), tuple(hidden)


def _probe(mode: str) -> bool:
    """True when an empty program runs to the end in ``mode`` (namespaces, private folders, privileges dropped)."""
    try:
        events, error, _ = _run_job("", "", [], [], SandboxLimits(timeout_s=20.0), mode=mode)
    except (OSError, subprocess.SubprocessError):
        return False
    return error is None and any(event.get("done") for event in events)


def _command(mode: str, uid: int, limits: SandboxLimits, workdir: str) -> list[str]:
    """The full argv: the wall-clock kill, the namespaces (layer 2), the first stage (``sandbox_isolation.py``: layers
    3 and 4), then the harness (layer 5), which the first stage execs."""
    argv: list[str] = []
    if shutil.which("timeout"):
        argv += ["timeout", "--signal=KILL", str(int(limits.timeout_s) + 2)]
    if mode == "none":
        return [*argv, sys.executable, "-I", "-S", "-c", _HARNESS_SOURCE, "mlmt-sandbox-harness"]
    # the interpreter's own file: the virtual environment's link to it is not in the view, nor its pyvenv.cfg
    harness = [os.path.realpath(sys.executable), "-I", "-S", "-c", _HARNESS_SOURCE, "mlmt-sandbox-harness"]
    user = ["--user", "--map-root-user"] if mode == "userns" else []
    argv += ["unshare", *user, "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]
    tmpfs = f"size={limits.tmp_mb}m,nr_inodes={limits.max_files}"
    view, hidden = ("\n".join(paths) for paths in filesystem_view())
    isolation = [sys.executable, "-I", "-S", "-c", _ISOLATION_SOURCE, mode, str(uid), workdir, tmpfs, view, hidden]
    return [*argv, *isolation, *harness]


def _read_events(proc: subprocess.Popen, nonce: str, limits: SandboxLimits, deadline: float) -> tuple[list, str | None]:
    """Reads nonce-tagged JSON events until EOF, the deadline, the output cap, or a stage that overran.

    After ``"started"`` the program and its setup code have ``2 * program_s``, after any other event the next probe,
    call or test ``per_test_s``, each plus twice the harness's grace: the harness's own alarm ends a stage sooner,
    so this clock, which the program cannot reach, ends what the alarm cannot: C code that never returns to the
    interpreter (``sum(range(10 ** 13))``, in any thread), a program that swallows or starves the alarm.
    """
    program_s = limits.per_test_s if limits.program_s is None else limits.program_s
    events, pending, total, error, stage_due = [], b"", 0, None, deadline
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = min(deadline, stage_due) - time.monotonic()
            if remaining <= 0:
                error = "timeout" if stage_due >= deadline else ABORTED
                break
            if not selector.select(timeout=remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > limits.max_output_bytes:
                error = "output limit exceeded"
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if (event := _parse_event(line, nonce)) is not None:
                    events.append(event)
                    stage_s = 2 * program_s if event.get("started") else limits.per_test_s
                    stage_due = time.monotonic() + stage_s + 2 * _GRACE_S
    if (event := _parse_event(pending, nonce)) is not None:
        events.append(event)
    return events, error


def _parse_event(line: bytes, nonce: str) -> dict | None:
    text = line.decode("utf-8", "replace")
    if not text.startswith(nonce):
        return None
    try:
        event = json.loads(text[len(nonce) :])
    except (ValueError, RecursionError):  # a malformed or forged line (JSONDecodeError is a ValueError)
        return None
    return event if isinstance(event, dict) else None


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.wait()


def _run_job(
    code: str, setup_code: str, tests: list[str], calls: list[str], limits: SandboxLimits, probes=(), mode=None
):
    """Runs one harness job in a fresh sandbox; returns ``(events, run-level error, duration_s)``."""
    mode = mode or isolation_mode(limits.isolation)
    uid = random.SystemRandom().randrange(*_UID_RANGE)
    workdir = tempfile.mkdtemp(prefix="mlmt_sandbox_")
    nonce = secrets.token_hex(16)
    job = {
        "isolation_mode": mode,
        "nonce": nonce,
        "code": code,
        "setup_code": setup_code or "",
        "tests": list(tests),
        "calls": list(calls),
        "probes": list(probes),
        "block_sockets": mode == "none",  # with a network namespace there is no network to block (3 ms a run)
        "limits": {
            "memory_mb": limits.memory_mb,
            "cpu_s": int(limits.timeout_s) + 1,
            "max_processes": limits.max_processes,
            "max_file_mb": limits.max_file_mb,
            "per_test_s": limits.per_test_s,
            "program_s": limits.per_test_s if limits.program_s is None else limits.program_s,
        },
    }
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}
    env.update({k: "C.UTF-8" for k in _SAFE_ENV_KEYS})
    start = time.monotonic()
    try:
        os.chmod(workdir, 0o700)  # with namespaces the program works in a tmpfs mounted over this folder
        proc = subprocess.Popen(
            _command(mode, uid, limits, workdir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
        try:
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            events, run_error = _read_events(proc, nonce, limits, start + limits.timeout_s)
        finally:
            _kill_session(proc)
            proc.stdout.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return events, run_error, time.monotonic() - start


def run_tests(code: str, tests: list[str], setup_code: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Runs ``code``, then its side of each test, in one fresh sandbox; compares with the expected sides here.

    Each test is split (:func:`agent_system.rewards.assert_split.split_test`): the sandbox evaluates only the
    program's side of the assert and sends its value back as plain data; the assert itself, expected values included,
    is evaluated in this process. A test that cannot be split runs whole in the sandbox (``SandboxResult.whole``).

    Args:
        code: The candidate program.
        tests: Test statements (MBPP's ``assert f(x) == y`` lines).
        setup_code: Code run after the program and before the tests (MBPP's ``test_setup_code``, or the
            sanitized set's ``test_imports``).
        limits: Resource limits; defaults to :class:`SandboxLimits`.

    Returns:
        The per-test outcome, the first failure message and any run-level error.
    """
    try:
        own = defined_names(code, setup_code)
    except UnparsableProgram as exc:  # it would not compile in the sandbox either: not run
        return SandboxResult([False] * len(tests), str(exc), "program error", 0.0, ["not run"] * len(tests),
                             [False] * len(tests))  # fmt: skip
    splits = [split_test(test, own) for test in tests]
    probes = [[hole, wrapper] for s in splits for hole, wrapper in zip(s.holes, s.wrappers, strict=True)]
    whole = [s.test for s in splits if s.whole]
    events, run_error, duration = _run_job(code, setup_code, whole, [], limits or SandboxLimits(), probes)
    done, loaded, probe_events, whole_events = False, False, {}, {}
    for event in events:
        if "program_error" in event:
            message = printable(str(event["program_error"]))
            return SandboxResult([False] * len(tests), message, "program error", duration, ["not run"] * len(tests),
                                 [s.whole for s in splits])  # fmt: skip
        if type(event.get("probe")) is int:
            probe_events.setdefault(event["probe"], event)
        elif type(event.get("test")) is int:
            whole_events.setdefault(event["test"], event)
        done = done or bool(event.get("done"))
        loaded = loaded or bool(event.get("loaded"))
        if "aborted" in event:  # the harness ended the run: a stage went on after its alarm
            run_error = run_error or ABORTED
    outcomes, messages, next_probe, next_whole = [], [], 0, 0
    for split in splits:
        if not loaded:  # the program never finished loading: no assert of it holds (not even `assert True`)
            outcome, message = "not run", ""
        elif split.whole:
            outcome, message = _whole_outcome(whole_events.get(next_whole))
            next_whole += 1
        else:
            found = [probe_events.get(next_probe + k) for k in range(len(split.holes))]
            next_probe += len(split.holes)
            outcome, message = _split_outcome(split, found)
        outcomes.append(outcome)
        messages.append(message)
    if not done:
        run_error = run_error or "exited early"
    unfinished = f"the program did not finish its tests ({run_error})"
    messages = [unfinished if o == "not run" else m for o, m in zip(outcomes, messages, strict=True)]
    passed = [outcome == "passed" for outcome in outcomes]
    first_failure = next((m for o, m in zip(outcomes, messages, strict=True) if o != "passed"), None)
    if not done and first_failure is None:
        first_failure = unfinished
    whole = [s.whole for s in splits]
    first_failure = None if first_failure is None else printable(first_failure)
    return SandboxResult(passed, first_failure, run_error if not done else None, duration, outcomes, whole)


def printable(text: str) -> str:
    """``text`` with lone surrogates and control characters (NUL, terminal escapes) replaced by ``?``: a message from
    the sandbox goes into prompts, tokenizers, logs and trajectory files, which may refuse them."""
    return _UNPRINTABLE.sub("?", text.encode("utf-8", "replace").decode("utf-8"))


def _whole_outcome(event: dict | None) -> tuple[str, str]:
    if event is None:
        return "not run", ""
    return ("passed", "") if event.get("ok") else ("failed", str(event.get("msg", "")))


def _split_outcome(split, events: list[dict | None]) -> tuple[str, str]:
    """The outcome of a split test from its probes' events: the assert is evaluated here, on plain values only."""
    test = split.test.strip()
    values = {}
    for k, (hole, event) in enumerate(zip(split.holes, events, strict=True)):
        if event is None:
            return "not run", ""
        if "unverifiable" in event:
            return "unverifiable result", f"unverifiable result: {hole} gave {event['unverifiable']}  [in: {test}]"
        if not event.get("ok"):
            return "failed", f"{str(event.get('msg', '')).strip()}  [in: {test}]"[:1000]
        try:
            value = decode_value(event.get("value"))
            values[f"{HOLE_PREFIX}{k}"] = Converted(value) if event.get("via") == split.wrappers[k] != "" else value
        except Unverifiable as exc:
            return "unverifiable result", f"unverifiable result: {hole} gave {exc}  [in: {test}]"
    try:
        if evaluate(split.check, values):
            return "passed", ""
        message = f"AssertionError: {test}"
        if split.left is not None:
            message += f"  (left side evaluated to {repr(evaluate(split.left, values))[:200]})"
        return "failed", message[:1000]
    except Exception as exc:  # a trusted function on the program's value, e.g. sorted() of mixed types
        return "failed", f"{type(exc).__name__}: {str(exc)[:300]}  [in: {test}]"


@dataclass
class CallsResult:
    """Outcome of :func:`run_calls`.

    Attributes:
        outcomes: Per call, ``("ok", value)``, ``("error", message)`` or ``("not run", reason)`` (the program failed,
            or the run ended, e.g. at its wall-clock limit, before the call).
        error: Run-level problem (``"timeout"``, ``"program error: ..."``, ...), else None.
        duration_s: Wall-clock seconds of the run.
    """

    outcomes: list[tuple[str, object]] = field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0


def run_calls(code: str, calls: list[str], limits: SandboxLimits | None = None) -> CallsResult:
    """Runs ``code``, then evaluates each expression of ``calls`` in its namespace, all in one fresh sandbox.

    Each call has the per-test limit (``limits.per_test_s``); the whole run ``limits.timeout_s``. A call's value must
    be JSON-encodable (else that call reports an error).

    Args:
        code: The program defining what the calls use.
        calls: Python expressions, evaluated in order.
        limits: Resource limits; defaults to :class:`SandboxLimits`.

    Returns:
        One outcome per call and any run-level error.
    """
    events, run_error, duration = _run_job(code, "", [], calls, limits or SandboxLimits())
    outcomes: list[tuple[str, object]] = [("not run", "")] * len(calls)
    for event in events:
        if "program_error" in event:
            run_error = f"program error: {printable(str(event['program_error']))}"
        elif "aborted" in event:
            run_error = run_error or ABORTED
        elif type(event.get("call")) is int and 0 <= event["call"] < len(calls):
            ok = bool(event.get("ok"))
            message = printable(str(event.get("msg", "")))
            outcomes[event["call"]] = ("ok", event.get("value")) if ok else ("error", message)
    finished = any(event.get("done") for event in events)
    if not finished and run_error is None:
        run_error = "exited early"
    reason = f"the sandbox run ended before this call ({run_error})"
    outcomes = [(kind, reason) if kind == "not run" else (kind, value) for kind, value in outcomes]
    return CallsResult(outcomes, run_error, duration)
