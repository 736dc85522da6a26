"""Stop on request: SIGUSR1 / SIGTERM ask the trainer to stop after its current step, with a checkpoint.

Slurm sends the batch script SIGUSR1 some time before a job's time limit (``#SBATCH --signal=B:USR1@600``) and
SIGTERM on preemption; ``mlmt-configs/submit_mlmt.sbatch`` forwards them to the trainer. ``MLMTTrainer.fit()`` checks
the request after each step: it writes a checkpoint (unless the step just wrote one), logs and leaves the loop; the
entry point then exits with :data:`EXIT_STOPPED` and the batch script requeues the job, which resumes from that
checkpoint. A second SIGTERM takes its default action (a plain ``kill`` twice still ends the run at once); a second
SIGUSR1 is only logged: it is a warning that can legitimately come twice (Slurm's time-limit warning after a
``scancel --signal=USR1``, or the batch script forwarding both the warning and a preemption), and ending the run on it
would kill the trainer while it writes the checkpoint. The entry point installs :data:`STOP_REQUEST` at start-up, so a
signal during model loading is kept too.
"""

from __future__ import annotations

import logging
import signal
import threading

logger = logging.getLogger(__name__)

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped early with a checkpoint; run the same command again to continue
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    """Set by the first SIGUSR1 / SIGTERM after :meth:`install`; :attr:`signal_name` says which one."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> StopRequest:
        """Handle the stop signals (idempotent; main thread only: elsewhere Python cannot install handlers)."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install` and forget the request."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()
        self.signal_name = None

    def release(self) -> None:
        """End of a run: :meth:`uninstall`, except that after a stop request SIGUSR1 stays ignored until the process
        exits. Between the checkpoint and the exit (the progress plot, the plan check, the reward pool, Ray's
        shutdown) a repeated warning, Slurm's own after a manual one or the batch script forwarding both, would
        otherwise take SIGUSR1's default action and end the trainer with status 138 instead of
        :data:`EXIT_STOPPED`, and the job would fail instead of requeueing."""
        stopping = self.requested
        self.uninstall()
        if stopping and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _handle(self, number: int, frame) -> None:
        name = signal.Signals(number).name
        if self.requested and number == signal.SIGUSR1:
            logger.warning("%s received again: already stopping after the current step", name)
            return
        if self.signal_name == name:  # SIGTERM twice: its default action (ends the process)
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)
            return
        self.signal_name = name
        logger.warning("%s received: stopping after the current step, with a checkpoint", name)


STOP_REQUEST = StopRequest()  # the process's one request (signal handlers are per process)
