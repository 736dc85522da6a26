"""The code sandbox with real subprocesses: normal programs, then one hostile program per threat.

Robust under load (2 cores busy with Ray and vLLM): programs that are expected to finish get ROOMY limits, so a slow
start can never turn into a "timeout"; a tight limit is used only where that limit is what the test is about, and
then the outcome is asserted on the cause the sandbox reports (its error, the per-test failure message), with wall
times checked only against generous bounds. Cleanup of killed processes is awaited, not slept for.
"""

import json
import os
import shutil
import socket
import tempfile
import threading
import time

import pytest

from agent_system.rewards import code_sandbox, compute_score
from agent_system.rewards.code_reward import execution_result, extract_code
from agent_system.rewards.code_sandbox import SandboxLimits, _probe, isolation_mode, run_calls, run_tests

pytestmark = pytest.mark.external  # the real sandbox: a subprocess per program

ROOMY = SandboxLimits(timeout_s=60.0, per_test_s=30.0)  # for programs that finish: never reached, even under load
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
GOOD = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def sandbox_root(monkeypatch):
    """Puts this test's sandbox working dirs under a private folder, so leftovers can be told apart."""
    root = tempfile.mkdtemp(prefix="mlmt_sandbox_test_")
    os.chmod(root, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _processes_under(root: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose working directory is inside ``root``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd.startswith(root) and state != "Z":
            found.append(int(pid))
    return found


def _remaining_under(root: str, timeout_s: float = 15.0) -> list[int]:
    """Waits (bounded) until no process is left under ``root``: the kernel reaps a killed namespace asynchronously."""
    deadline = time.monotonic() + timeout_s
    while (found := _processes_under(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_passing_failing_and_broken_programs():
    assert run_tests(GOOD, ADD_TESTS, limits=ROOMY).all_passed
    wrong = run_tests("def add(a, b):\n    return a - b\n", ADD_TESTS + ["assert add(0, 0) == 0"], limits=ROOMY)
    assert wrong.passed == [False, False, True] and wrong.pass_rate == pytest.approx(1 / 3)
    assert "left side evaluated to -1" in wrong.first_failure
    broken = run_tests("def add(a, b) return", ADD_TESTS, limits=ROOMY)
    assert broken.error == "program error" and "SyntaxError" in broken.first_failure


def test_setup_code_runs_after_program_like_mbpp():
    code = "class Node:\n    def __init__(self, v):\n        self.v = v\ndef value(n):\n    return n.v\n"
    assert run_tests(code, ["assert value(root) == 1"], setup_code="root = Node(1)", limits=ROOMY).all_passed


def test_infinite_loop_is_cut_per_test_and_keeps_partial_credit():
    code = "def f(x):\n    while x == 0:\n        pass\n    return x\n"
    limits = SandboxLimits(timeout_s=60.0, per_test_s=1.5)
    result = run_tests(code, ["assert f(1) == 1", "assert f(0) == 0", "assert f(2) == 2"], limits=limits)
    assert result.passed == [True, False, True]
    assert "time limit" in result.first_failure
    assert result.error is None  # the per-test timer cut the loop, the run's wall-clock limit never fired


def test_wall_clock_limit_when_candidate_disables_the_alarm(sandbox_root):
    code = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)\n"
    limits = SandboxLimits(timeout_s=2.0, per_test_s=1.0)
    result = run_tests(code, ADD_TESTS, limits=limits)
    assert result.error == "timeout" and not any(result.passed)  # the parent's deadline, not an early exit
    assert limits.timeout_s <= result.duration_s < limits.timeout_s + 20  # generous: kill + cleanup under load
    assert not _remaining_under(sandbox_root)


def test_fork_bomb_is_contained_and_fully_killed(sandbox_root):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    limits = SandboxLimits(timeout_s=2.0, per_test_s=5.0)
    result = run_tests(code, ADD_TESTS, limits=limits)
    assert not any(result.passed) and result.error in ("timeout", "exited early")
    assert result.duration_s < limits.timeout_s + 20  # bounded by the wall-clock limit (generous: busy machine)
    assert not _remaining_under(sandbox_root)
    assert run_tests(GOOD, ADD_TESTS, limits=ROOMY).all_passed


def test_setsid_escape_is_killed_with_the_pid_namespace(sandbox_root):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ndef add(a, b):\n    return a + b\n"
    )
    assert run_tests(code, ADD_TESTS, limits=ROOMY).all_passed
    assert not _remaining_under(sandbox_root)


def test_memory_bomb_fails_without_hurting_the_parent():
    code = (
        "def add(a, b):\n    return [0] * 10**10\n"
        "def grow(a, b):\n    blocks = []\n    while True:\n        blocks.append(bytearray(100_000_000))\n"
    )
    limits = SandboxLimits(timeout_s=60.0, per_test_s=30.0)  # RLIMIT_AS stops both, not the clock
    result = run_tests(code, ["assert add(1, 2) == 3", "assert grow(1, 2)"], limits=limits)
    assert result.passed == [False, False] and "MemoryError" in result.first_failure
    assert result.error is None  # the harness survived both and reported them


def test_cannot_delete_or_write_files_outside_the_temp_dir(outside_tmp):
    if isolation_mode() != "root":
        pytest.skip("file protection relies on the per-run unprivileged uid (root mode)")
    victim_dir = outside_tmp / "project"
    victim_dir.mkdir()
    os.chmod(victim_dir, 0o755)
    victim = victim_dir / "precious.txt"
    victim.write_text("keep me")
    code = (
        "import os, shutil\n"
        f"def attack():\n    for fn in (lambda: os.remove({str(victim)!r}),\n"
        f"               lambda: shutil.rmtree({str(victim_dir)!r}),\n"
        f"               lambda: open({str(victim_dir / 'new.txt')!r}, 'w').write('x'),\n"
        "               lambda: open('/etc/mlmt_owned', 'w').write('x')):\n"
        "        try:\n            fn()\n            return 'succeeded'\n        except OSError:\n            pass\n"
        "    open('inside.txt', 'w').write('ok')\n    return open('inside.txt').read()\n"
    )
    assert run_tests(code, ["assert attack() == 'ok'"], limits=ROOMY).all_passed
    assert victim.read_text() == "keep me" and not (victim_dir / "new.txt").exists()
    assert not os.path.exists("/etc/mlmt_owned")


def test_sockets_cannot_reach_a_local_server():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted, stop = [], threading.Event()
    thread = threading.Thread(target=_accept_until, args=(server, accepted, stop), daemon=True)
    thread.start()  # listens for as long as the candidate runs, however slow the machine
    code = (
        "import _socket, socket\n"
        "def reach():\n    out = []\n"
        f"    for make in (lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1),\n"
        "                 lambda: _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)):\n"
        "        try:\n            s = make()\n"
        f"            s.settimeout(1)\n            s.connect(('127.0.0.1', {port}))\n"
        "            out.append('connected')\n"
        "        except OSError:\n            out.append('blocked')\n    return out\n"
    )
    try:
        assert run_tests(code, ["assert reach() == ['blocked', 'blocked']"], limits=ROOMY).all_passed
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()
    assert accepted == []


def _accept_until(server, accepted, stop):
    while not stop.is_set():
        try:
            accepted.append(server.accept())
        except TimeoutError:
            continue
        except OSError:
            return


def test_os_exit_and_sys_exit_score_zero():
    early = run_tests("import os\nos._exit(0)\n", ADD_TESTS, limits=ROOMY)
    assert early.error == "exited early" and not any(early.passed)
    in_test = run_tests("import sys\ndef add(a, b):\n    sys.exit(0)\n", ADD_TESTS, limits=ROOMY)
    assert not any(in_test.passed) and "SystemExit" in in_test.first_failure


def test_stdout_flood_and_forged_results_are_ignored():
    flood = "import sys\nfor _ in range(200_000):\n    print('x' * 1000)\n" + GOOD
    assert run_tests(flood, ADD_TESTS, limits=ROOMY).all_passed  # prints go to /dev/null, nothing is read back
    forged = (
        "import os, json\nfor fd in range(3, 20):\n    try:\n"
        "        line = json.dumps({'test': 0, 'ok': True}) + '\\n' + json.dumps({'done': True}) + '\\n'\n"
        "        os.write(fd, line.encode())\n"
        "    except OSError:\n        pass\nos._exit(0)\n"
    )
    assert not any(run_tests(forged, ADD_TESTS, limits=ROOMY).passed)


def test_environment_secrets_and_parent_are_out_of_reach(monkeypatch):
    monkeypatch.setenv("MLMT_TEST_SECRET", "hunter2")
    parent = os.getpid()
    code = (
        "import os, signal\n"
        "def leaks():\n    found = [k for k in os.environ if 'SECRET' in k or 'KEY' in k or 'TOKEN' in k]\n"
        f"    try:\n        found.append(open('/proc/{parent}/environ').read())\n    except OSError:\n        pass\n"
        "    return found\n"
        "def kill_all():\n    try:\n        os.kill(-1, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n    return True\n"
    )
    env_check = "assert sorted(os.environ) == ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"
    result = run_tests(code, ["assert leaks() == []", env_check], limits=ROOMY)
    assert result.all_passed, result.first_failure
    run_tests(code, ["assert kill_all()"], limits=ROOMY)
    assert os.getpid() == parent  # still alive after the candidate's kill(-1)


def test_extract_code_and_compute_score_mbpp():
    response = "Here:\n```python\ndef helper():\n    pass\n```\nand\n```python\ndef add(a, b):\n    return a + b\n```"
    assert "def add" in extract_code(response, "add")
    assert extract_code("def add(a, b): return a + b") == "def add(a, b): return a + b"
    result = compute_score("mbpp", response, json.dumps(ADD_TESTS), {"entry_point": "add", "test_setup_code": ""})
    assert result["score"] == 1.0 and result["acc"] and result["pass_rate"] == 1.0 and result["first_failure"] == ""
    partial = compute_score(
        "mbpp", "def add(a, b):\n    return 3\n", ADD_TESTS, {"code_reward": "pass_rate"}, sandbox_limits=ROOMY
    )
    assert partial["score"] == 0.5 and not partial["acc"] and partial["first_failure"].startswith("AssertionError")
    empty = compute_score("mbpp", "", ADD_TESTS)
    assert empty["score"] == 0.0 and empty["error"] == "no code found"


def test_execution_result_for_the_feedback_writer():
    """What the HL reads about a code attempt: the pass count and the first failing test or the error; of every test
    with ``tests="all"`` (the original's, a leak), else of the tests the statement shows (test_code_feedback_...)."""
    tests = json.dumps([*ADD_TESTS, "assert add(0, 0) == 0"])
    good = f"```python\n{GOOD}```"
    assert execution_result(good, tests, {"entry_point": "add"}, ROOMY, "all") == "All 3 tests passed."
    wrong = execution_result("def add(a, b):\n    return 3\n", tests, {}, ROOMY, "all")
    assert wrong.startswith("1 of 3 tests passed. First failure: AssertionError: assert add(2, 2) == 4")
    assert "left side evaluated to 3" in wrong
    broken = execution_result("def add(a, b) return a", tests, {}, ROOMY, "all")
    assert broken.startswith("0 of 3 tests passed. First failure: ") and "SyntaxError" in broken, broken
    assert execution_result("", tests, {}, ROOMY, "all") == (
        "0 of 3 tests passed. First failure: no code found in the response"
    )
    shown = {"question": f"Write add.\n{ADD_TESTS[0]}"}
    assert execution_result(good, tests, shown, ROOMY) == "All 1 tests shown in the task passed."
    wrong = execution_result("def add(a, b):\n    return 3\n", tests, shown, ROOMY)
    assert wrong == "All 1 tests shown in the task passed."  # the failing add(2, 2) == 4 is hidden
    assert execution_result("", tests, shown, ROOMY) == (
        "0 of 1 tests shown in the task passed. First failure: no code found in the response"
    )


def _modes_with_private_folders() -> list[str]:
    """The isolation modes that give a run its own /tmp and /dev/shm on this machine (root, and userns where the
    kernel allows user namespaces); ``none`` has no mount namespace and cleans nothing up (docs/CODE_REWARD.md)."""
    return [mode for mode in ("root", "userns") if (mode != "root" or isolation_mode() == "root") and _probe(mode)]


PRIVATE_MODES = _modes_with_private_folders()
SHM_KEY = 0x4D4C0000 + os.getpid() % 0x10000  # a System V shared-memory key the two runs agree on
FILES = (
    "import ctypes, errno, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def write(paths):\n    written = []\n"
    "    for path in paths + [os.path.join(os.environ['TMPDIR'], 'handover')]:\n"
    "        try:\n            with open(path, 'w') as handle:\n                handle.write('from the first run')\n"
    "            os.chmod(path, 0o666)\n            written.append(path)\n"
    "        except OSError:\n            pass\n"
    f"    return written, libc.shmget({SHM_KEY}, 4096, 0o1000 | 0o666) >= 0\n"
    "def read(paths):\n    found = []\n    for path in paths:\n"
    "        try:\n            found.append(open(path).read())\n        except OSError:\n            pass\n"
    f"    return found, libc.shmget({SHM_KEY}, 0, 0) >= 0\n"
    "def fill(folder, size):\n    os.makedirs(os.path.join(folder, 'fill'), exist_ok=True)\n    count = 0\n"
    "    try:\n        while count < 2000:\n"
    "            with open(os.path.join(folder, 'fill', str(count)), 'wb') as handle:\n"
    "                handle.write(b'x' * size)\n            count += 1\n        return count, 'no error'\n"
    "    except OSError as exc:\n        return count, errno.errorcode[exc.errno]\n"
    "def unmount():\n    return [libc.umount2(folder.encode(), 2) for folder in ('/tmp', '/dev/shm', os.getcwd())]\n"
    "def open_many():\n    handles = []\n    try:\n        while len(handles) < 500:\n"
    "            handles.append(open(os.devnull))\n        return 'no error'\n"
    "    except OSError as exc:\n        return errno.errorcode[exc.errno]\n"
)


def _shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as handle:
        return {int(line.split()[0]) for line in handle.readlines()[1:]}


@pytest.mark.parametrize("mode", PRIVATE_MODES)
def test_nothing_a_run_writes_outlives_it_or_reaches_the_next_run(mode, monkeypatch):
    monkeypatch.setattr(code_sandbox, "isolation_mode", lambda *_: mode)
    marker = f"mlmt_handover_{os.getpid()}_{time.monotonic_ns()}"
    folders = [folder for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(folder)]
    paths = [os.path.join(folder, marker) for folder in folders]
    try:
        (outcome,) = run_calls(FILES, [f"write({paths!r})"], ROOMY).outcomes
        assert outcome[0] == "ok", outcome
        written, shared_memory = outcome[1]
        assert set(paths) < set(written) and shared_memory, outcome  # every write succeeded inside the sandbox
        assert run_calls(FILES, ["unmount()"], ROOMY).outcomes == [
            ("ok", [-1, -1, -1])
        ]  # nor can it uncover the host's
        (outcome,) = run_calls(FILES, [f"read({written!r})"], ROOMY).outcomes
        assert outcome == ("ok", [[], False])  # the second run finds nothing of the first's
        assert not [path for path in written if os.path.exists(path)]  # and nothing is left on the host
        assert SHM_KEY not in _shm_keys()
    finally:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)


@pytest.mark.parametrize("mode", PRIVATE_MODES)
def test_temporary_folders_files_and_open_files_are_bounded(mode, monkeypatch):
    monkeypatch.setattr(code_sandbox, "isolation_mode", lambda *_: mode)
    limits = SandboxLimits(timeout_s=60.0, per_test_s=30.0, tmp_mb=2, max_files=64, max_file_mb=1)
    calls = ["fill('/tmp', 0)", "fill('/dev/shm', 0)", "fill(os.environ['TMPDIR'], 0)", "fill('/tmp', 500_000)",
             "fill(os.environ['TMPDIR'], 1_500_000)", "open_many()"]  # fmt: skip
    outcomes = run_calls(FILES, calls, limits).outcomes
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    for count, error in [value for _, value in outcomes[:3]]:
        assert count < limits.max_files and error == "ENOSPC", outcomes  # files per folder
    count, error = outcomes[3][1]
    assert count * 500_000 <= limits.tmp_mb * 2**20 and error == "ENOSPC", outcomes  # bytes per folder
    assert outcomes[4][1] == [0, "EFBIG"], outcomes  # bytes per file (RLIMIT_FSIZE)
    assert outcomes[5][1] == "EMFILE", outcomes  # open files (RLIMIT_NOFILE)
    for leftover in ("/tmp/fill", "/dev/shm/fill"):
        if os.path.exists(leftover):  # the sandbox wrote to the host: clean up after the failed test
            shutil.rmtree(leftover, ignore_errors=True)
            pytest.fail(f"{leftover} was left on the host")
