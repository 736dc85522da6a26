"""What a sandboxed program can reach (issue 45, point 1): one hostile program per row of docs/CODE_REWARD.md's table.

Each isolated mode this machine offers (``root``, and ``userns`` where the kernel allows user namespaces) runs the same
program, which tries to read a secret planted in the trainer's home, a planted data file and the repository, to write
into the repository and the virtual environment, to reach a local server, to signal a process of the trainer and to
fork past its limit. The planted files lie outside the temporary folders (a run has its own ``/tmp``), in the
repository's git-ignored ``outputs/`` folder, world-readable as a data set or a checkout is, the home folder private
as a home is. ``none`` mode (``mlmt.reward.sandbox=none``) runs the same program and reaches all of it: the test of each
row can fail. Before the filesystem view, ``userns`` mode read and wrote all of it, and ``root`` mode read the data
and the repository.
"""

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import pytest

from agent_system.rewards import code_sandbox
from agent_system.rewards.code_sandbox import SandboxLimits, SandboxUnavailable, _probe, run_calls

pytestmark = pytest.mark.external  # the real sandbox: a subprocess per program

REPO = Path(__file__).resolve().parents[3]
ISOLATED_MODES = [mode for mode in ("root", "userns") if (mode != "root" or os.geteuid() == 0) and _probe(mode)]
LIMITS = SandboxLimits(timeout_s=60.0, per_test_s=30.0)  # never reached by a program that finishes, even under load
ATTACKS = (
    "import _socket, os, signal, time\n"
    "def read(path):\n"
    "    try:\n        with open(path) as handle:\n            return handle.read()\n"
    "    except OSError as exc:\n        return type(exc).__name__\n"
    "def write(path):\n"
    "    try:\n        with open(path, 'w') as handle:\n            handle.write('# by a sandboxed program\\n')\n"
    "        return 'written'\n"
    "    except OSError as exc:\n        return type(exc).__name__\n"
    "def connect(port):\n"
    "    try:\n        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n        s.settimeout(2)\n"
    "        s.connect(('127.0.0.1', port))\n        return 'connected'\n"
    "    except OSError as exc:\n        return type(exc).__name__\n"
    "def signal_process(pid):\n"
    "    try:\n        os.kill(pid, signal.SIGTERM)\n        return 'signalled'\n"
    "    except OSError as exc:\n        return type(exc).__name__\n"
    "def fork(count):\n    forked = 0\n"
    "    for _ in range(count):\n"
    "        try:\n            pid = os.fork()\n        except OSError:\n            break\n"
    "        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n"
    "        forked += 1\n"
    "    return forked\n"
)


@pytest.fixture
def planted(monkeypatch):
    """The trainer's home (``HOME``, a private folder holding ``.netrc`` and a hub token) and a world-readable data
    folder, outside the temporary folders; removed afterwards."""
    outputs = REPO / "outputs"
    outputs.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sandbox_view_", dir=outputs))
    home, data = folder / "home", folder / "data"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".netrc").write_text("machine api.wandb.ai login user password planted-wandb-key\n")
    (home / ".cache" / "huggingface" / "token").write_text("planted-hub-token")
    data.mkdir()
    (data / "mbpp.jsonl").write_text('{"task_id": 2, "test_list": ["assert f(1) == 2"]}\n')
    for path, mode in ((folder, 0o755), (home, 0o700), (home / ".netrc", 0o600), (data, 0o755)):
        os.chmod(path, mode)
    os.chmod(data / "mbpp.jsonl", 0o644)
    monkeypatch.setenv("HOME", str(home))
    yield {"netrc": home / ".netrc", "token": home / ".cache/huggingface/token", "data": data / "mbpp.jsonl"}
    shutil.rmtree(folder, ignore_errors=True)


def _targets_to_write() -> list[Path]:
    """A new file in the repository and a ``.pth`` file in the virtual environment (which every later start reads)."""
    name = f"mlmt_sandbox_written_{os.getpid()}"
    return [REPO / name, Path(sysconfig.get_paths()["purelib"]) / f"{name}.pth"]


def _attack(mode: str, planted: dict, monkeypatch) -> dict:
    """The outcome of each attempt of :data:`ATTACKS` in ``mode``, with a server to reach and a process to signal."""
    monkeypatch.setattr(code_sandbox, "isolation_mode", lambda *_: mode)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    threading.Thread(target=_accept_all, args=(server,), daemon=True).start()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a process of the trainer
    written = _targets_to_write()
    calls = {
        "home": f"[read({str(planted['netrc'])!r}), read({str(planted['token'])!r})]",
        "data": f"read({str(planted['data'])!r})",
        "repository": f"read({str(REPO / 'README.md')!r})[:8]",
        "write": f"[write({str(written[0])!r}), write({str(written[1])!r})]",
        "network": f"connect({server.getsockname()[1]})",
        "signal": f"signal_process({victim.pid})",
        "fork": f"fork({3 * LIMITS.max_processes})",
    }
    try:
        result = run_calls(ATTACKS, list(calls.values()), LIMITS)
        outcomes = dict(zip(calls, result.outcomes, strict=True))
        outcomes["written"] = [path.exists() for path in written]
        outcomes["victim alive"] = victim.poll() is None
        return outcomes
    finally:
        for path in written:
            path.unlink(missing_ok=True)
        victim.kill()
        victim.wait()
        server.close()


def _accept_all(server: socket.socket) -> None:
    while True:
        try:
            server.accept()[0].close()
        except OSError:
            return


@pytest.mark.parametrize("mode", ISOLATED_MODES)
def test_a_program_reaches_nothing_of_the_host(mode, planted, monkeypatch):
    outcomes = _attack(mode, planted, monkeypatch)
    assert outcomes["home"] == ("ok", ["FileNotFoundError", "FileNotFoundError"]), outcomes
    assert outcomes["data"] == ("ok", "FileNotFoundError"), outcomes
    assert outcomes["repository"] == ("ok", "FileNotF"), outcomes  # the first 8 characters of the error name
    assert outcomes["write"][0] == "ok" and "written" not in outcomes["write"][1], outcomes
    assert outcomes["written"] == [False, False], outcomes
    assert outcomes["network"] == ("ok", "OSError"), outcomes  # no interface is up (ENETUNREACH)
    assert outcomes["signal"] == ("ok", "ProcessLookupError") and outcomes["victim alive"], outcomes
    kind, forked = outcomes["fork"]
    assert kind == "ok", outcomes
    if mode == "root" or os.geteuid() != 0:  # the kernel exempts the host's root from RLIMIT_NPROC, in any namespace
        assert forked < LIMITS.max_processes, outcomes


def test_without_isolation_the_same_program_reaches_all_of_it(planted, monkeypatch):
    """``mlmt.reward.sandbox=none``: what each row of the table stops is what this program does without it."""
    outcomes = _attack("none", planted, monkeypatch)
    assert outcomes["home"] == ("ok", ["machine api.wandb.ai login user password planted-wandb-key\n",
                                       "planted-hub-token"]), outcomes  # fmt: skip
    assert outcomes["data"][1].startswith('{"task_id": 2') and outcomes["repository"] == ("ok", "# MLMT-R")
    assert outcomes["write"] == ("ok", ["written", "written"]) and outcomes["written"] == [True, True], outcomes
    assert outcomes["network"] == ("ok", "connected"), outcomes  # past the in-process socket block (via _socket)
    assert outcomes["signal"] == ("ok", "signalled") and not outcomes["victim alive"], outcomes


@pytest.mark.parametrize("mode", ISOLATED_MODES)
def test_the_view_holds_the_interpreter_and_libraries_only(mode, monkeypatch):
    monkeypatch.setattr(code_sandbox, "isolation_mode", lambda *_: mode)
    view, hidden = code_sandbox.filesystem_view()
    interpreter = os.path.realpath(sys.executable)
    calls = ["sorted(os.listdir('/'))", "sys.executable", "sorted(os.listdir('/dev'))",
             f"[os.listdir(folder) for folder in {list(hidden)!r}]", f"os.path.exists({sys.prefix!r})"]  # fmt: skip
    outcomes = [value for _, value in run_calls("import os, sys\n", calls, LIMITS).outcomes]
    top = {path.split("/")[1] for path in view} | {"dev", "proc", "tmp", "var", "run"}
    assert set(outcomes[0]) <= top, outcomes  # no home, no /work or /data, no /opt
    assert outcomes[1] == interpreter and interpreter in view, outcomes  # its own file, not the venv's link to it
    assert set(outcomes[2]) <= {"null", "zero", "full", "random", "urandom", "shm"}, outcomes
    assert outcomes[3] == [[] for _ in hidden], outcomes  # the interpreter's site-packages are empty
    if sys.prefix != sys.base_prefix:
        assert outcomes[4] is False, outcomes  # no virtual environment


def test_no_isolation_available_is_one_line_naming_the_key(monkeypatch):
    monkeypatch.setattr(code_sandbox, "_probe", lambda mode: False)
    isolation = code_sandbox.isolation_mode.__wrapped__  # the probe is cached per process
    with pytest.raises(SandboxUnavailable, match=r"mlmt\.reward\.sandbox=none") as raised:
        isolation("isolated")
    assert "\n" not in str(raised.value) and "unshare" in str(raised.value)
    assert isolation("none") == "none"
    with pytest.raises(ValueError, match="isolation='off'"):
        isolation("off")


def test_the_start_up_check_refuses_code_rows_only(monkeypatch):
    import pandas as pd

    from agent_system.launcher.main import check_sandbox, user_errors

    monkeypatch.setattr(code_sandbox, "isolation_mode", code_sandbox.isolation_mode.__wrapped__)
    monkeypatch.setattr(code_sandbox, "_probe", lambda mode: False)
    math, code = pd.DataFrame({"data_source": ["math"]}), pd.DataFrame({"data_source": ["mbpp"]})
    check_sandbox("isolated", [math, None])  # no program runs: no sandbox needed
    with pytest.raises(user_errors()) as raised:
        check_sandbox("isolated", [math, code])
    assert isinstance(raised.value, SandboxUnavailable)
    check_sandbox("none", [math, code])


@pytest.mark.skipif(not ISOLATED_MODES, reason="no isolated mode on this machine")
def test_the_key_reaches_the_reward_pool_workers():
    from agent_system.rewards.pool import RewardPool

    planted = REPO / "README.md"
    program = f"```python\ndef head():\n    return open({str(planted)!r}).read(8)\n```"
    item = {"data_source": "mbpp", "solution_str": program, "ground_truth": ["assert head() == '# MLMT-R'"]}
    scores = {}
    for sandbox in ("isolated", "none"):
        with RewardPool(1, 30.0, sandbox=sandbox) as pool:
            scores[sandbox] = pool.score([{**item, "extra_info": {}}])[0]["score"]
    assert scores == {"isolated": 0.0, "none": 1.0}, scores
