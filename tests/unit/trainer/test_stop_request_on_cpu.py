"""StopRequest: SIGUSR1 / SIGTERM set a stop request (fit() stops after the step, with a checkpoint)."""

import os
import signal

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
