"""StopRequest: SIGUSR1 / SIGTERM set a stop request (fit() stops after the step, with a checkpoint)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from agent_system.trainer.stop_request import StopRequest


def test_signals_set_the_request_and_uninstall_restores_the_handlers():
    before = {number: signal.getsignal(number) for number in (signal.SIGUSR1, signal.SIGTERM)}
    stop = StopRequest().install()
    try:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.signal_name == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGTERM)  # a different signal keeps the request (preemption: forwarded + direct)
        assert stop.requested
    finally:
        stop.uninstall()
    assert not stop.requested
    assert {number: signal.getsignal(number) for number in before} == before


def test_install_is_idempotent():
    stop = StopRequest().install()
    try:
        handler = signal.getsignal(signal.SIGUSR1)
        stop.install()
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is not handler


@pytest.mark.external
def test_a_repeated_warning_is_ignored_and_a_repeated_term_ends_the_process():
    """Two SIGUSR1 (Slurm's time-limit warning after a manual one) killed the trainer while it wrote its checkpoint:
    the Slurm test's job ended FAILED when its warning came during the stop its own USR1 had asked for."""
    script = textwrap.dedent(
        """
        import os, signal
        from agent_system.trainer.stop_request import StopRequest
        stop = StopRequest().install()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        print("alive after two SIGUSR1:", stop.signal_name, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        print("alive after a SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        print("alive after two SIGTERM", flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "alive after two SIGUSR1: SIGUSR1" in result.stdout, result.stdout + result.stderr
    assert "received again: already stopping" in result.stderr
    assert "alive after a SIGTERM" in result.stdout  # a different signal keeps the request
    assert "alive after two SIGTERM" not in result.stdout
    assert result.returncode == -signal.SIGTERM


@pytest.mark.external
def test_after_a_stop_request_a_warning_during_shutdown_does_not_end_the_process():
    """The trainer released its handlers before the reward pool and Ray shut down: a SIGUSR1 in that window took its
    default action, the trainer ended with 138 instead of 75, and the Slurm test's job failed instead of requeueing."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from agent_system.trainer.stop_request import EXIT_STOPPED, StopRequest
        stop = StopRequest().install()
        os.kill(os.getpid(), signal.SIGUSR1)
        stop.release()
        os.kill(os.getpid(), signal.SIGUSR1)
        print("alive after a SIGUSR1 during shutdown", flush=True)
        sys.exit(EXIT_STOPPED)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "alive after a SIGUSR1 during shutdown" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 75


def test_release_without_a_request_restores_the_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    StopRequest().install().release()
    assert signal.getsignal(signal.SIGUSR1) == before
