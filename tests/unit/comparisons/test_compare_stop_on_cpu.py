"""The comparison's stop on request (agent_system/comparisons/compare.py, ``StopForwarder``), with stand-in child
processes (nothing is started): a training's exit 75 stops the comparison (exit 75, one line) instead of failing it; a
stop request (SIGUSR1 / SIGTERM, as recipes/submit_compare.sbatch passes Slurm's warning on) goes on to the running
training as SIGUSR1 and to an evaluation as SIGTERM, once, and no run starts after it; a failed run is one line.
The same on real Slurm: tests/integration/test_slurm_eval_and_compare_on_cpu.py.

    .venv/bin/python -m pytest tests/unit/comparisons/test_compare_stop_on_cpu.py
"""

from __future__ import annotations

import signal

import pytest

from agent_system.comparisons import compare


class Child:
    """A stand-in for ``subprocess.Popen``: ``wait`` runs ``during`` (a signal arriving while the comparison waits),
    then returns ``returncode``; the signals passed on to it are kept."""

    started: list[Child] = []

    def __init__(self, returncode: int, during=None):
        self.returncode_on_exit, self.during, self.signals, self.command = returncode, during, [], None

    def __call__(self, command, **kwargs):  # the Popen call
        self.command = command
        Child.started.append(self)
        return self

    def send_signal(self, number):
        self.signals.append(number)

    def wait(self):
        if self.during:
            self.during()
        return self.returncode_on_exit

    def kill(self):
        pass


@pytest.fixture
def stopping(monkeypatch):
    """A fresh stop request for each test (the module's one is per process)."""
    forwarder = compare.StopForwarder()
    monkeypatch.setattr(compare, "STOPPING", forwarder)
    Child.started = []
    return forwarder


def _child(monkeypatch, returncode: int, during=None) -> Child:
    child = Child(returncode, during)
    monkeypatch.setattr(compare.subprocess, "Popen", child)
    return child


@pytest.mark.parametrize(
    ("returncode", "requested", "stopped"),
    [
        (75, False, True),  # the trainer stopped with a checkpoint, whoever asked (Slurm signals every process)
        (75, True, True),
        (-signal.SIGUSR1, True, True),  # a training still importing, killed by the passed-on request
        (-signal.SIGTERM, True, True),  # an evaluation ended by it
        (128 + signal.SIGUSR1, True, True),  # the same through a shell
        (-signal.SIGTERM, False, False),  # killed, but nobody asked the comparison to stop: a failure
        (0, True, False),
        (1, True, False),
        (-signal.SIGKILL, True, False),
    ],
)
def test_which_exits_are_a_stop(returncode, requested, stopped):
    assert compare.stopped_on_request(returncode, requested) is stopped


def test_a_training_that_exits_75_stops_the_comparison_instead_of_failing_it(stopping, monkeypatch, tmp_path):
    child = _child(monkeypatch, 75)
    with pytest.raises(compare.Stopped, match=r"grpo's training \(seed0\) stopped on request \(exit 75\)"):
        compare.train(["x=1"], "grpo", tmp_path / "seed0", 2)
    assert child.command[1:3] == ["-m", "verl.trainer.main_mlmt"] and child.signals == []
    assert not (tmp_path / "seed0" / "train_minutes.txt").exists()  # not timed as a finished run


def test_a_request_during_a_training_goes_on_to_it_as_sigusr1_once(stopping, monkeypatch, tmp_path):
    def signals_arrive():  # Slurm's warning, then the batch script's forwarded preemption
        stopping.handle(signal.SIGUSR1)
        stopping.handle(signal.SIGUSR1)

    child = _child(monkeypatch, 75, signals_arrive)
    with pytest.raises(compare.Stopped):
        compare.train([], "mlmt", tmp_path / "seed0", 2)
    assert child.signals == [signal.SIGUSR1]


def test_a_request_during_an_evaluation_ends_it_with_sigterm(stopping, monkeypatch, tmp_path):
    import agent_system.launcher.export as export

    monkeypatch.setattr(export, "export_checkpoint", lambda run_dir, step: {"ll": "LL", "hl": "HL"})
    child = _child(monkeypatch, -signal.SIGTERM, lambda: stopping.handle(signal.SIGUSR1))
    args = compare.parse_args(["--out", str(tmp_path), "--baselines", "grpo"])
    (tmp_path / "grpo" / "seed0").mkdir(parents=True)
    with pytest.raises(compare.Stopped, match=r"grpo's evaluation \(seed0\) stopped on request .* problems kept"):
        compare.evaluate(args, "grpo", tmp_path / "grpo" / "seed0")
    assert child.signals == [signal.SIGTERM] and child.command[1].endswith("eval_math500.sh")


def test_after_a_request_no_run_starts(stopping, monkeypatch, tmp_path):
    child = _child(monkeypatch, 0)
    stopping.handle(signal.SIGTERM)  # e.g. while the previous run was exported
    with pytest.raises(compare.Stopped, match=r"SIGTERM received before grpo's training"):
        compare.train([], "grpo", tmp_path / "seed0", 2)
    args = compare.parse_args(["--out", str(tmp_path)])
    with pytest.raises(compare.Stopped, match="before mlmt's evaluation"):
        compare.evaluate(args, "mlmt", tmp_path / "seed0")  # before its export, too
    assert Child.started == [] and child.command is None


def test_a_failed_training_is_still_a_failure(stopping, monkeypatch, tmp_path):
    _child(monkeypatch, 1)
    with pytest.raises(compare.RunFailed, match=r"grpo: training failed \(exit 1\); see .*train.log"):
        compare.train([], "grpo", tmp_path / "seed0", 2)


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (
            compare.Stopped("mlmt's training (seed0) stopped on request (exit 75), resumable from its last checkpoint"),
            75,
            "stopped: mlmt's training (seed0) stopped on request (exit 75), resumable from its last checkpoint; "
            "the same command continues the comparison (exit 75)",
        ),
        (
            compare.RunFailed("grpo: training failed (exit 1); see run/train.log"),
            1,
            "error: grpo: training failed (exit 1); see run/train.log",
        ),
    ],
)
def test_main_ends_a_stop_or_a_failed_run_with_one_line(raised, code, line, stopping, monkeypatch, tmp_path, capsys):
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)

    def run_comparison(args):
        assert signal.getsignal(signal.SIGUSR1) == stopping.handle  # listening while it runs
        raise raised

    monkeypatch.setattr(compare, "run_comparison", run_comparison)
    with pytest.raises(SystemExit) as ended:
        compare.main(["--out", str(tmp_path)])
    assert ended.value.code == code
    assert capsys.readouterr().err.splitlines() == [line]
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == before  # put back


def test_a_real_sigusr1_stops_the_comparison_before_its_next_run(stopping, monkeypatch, tmp_path, capsys):
    _child(monkeypatch, 0)  # never started

    def run_comparison(args):
        signal.raise_signal(signal.SIGUSR1)  # delivered to the handler main() installed
        compare.train([], "grpo", tmp_path / "seed0", 2)

    monkeypatch.setattr(compare, "run_comparison", run_comparison)
    with pytest.raises(SystemExit) as ended:
        compare.main(["--out", str(tmp_path)])
    assert ended.value.code == 75 and Child.started == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("stopped: SIGUSR1 received before grpo's training (seed0)")
