"""The driver's console of a run, its log files (``<run>/logs/``) and its final summary.

The console shows a short start-up summary (models, ranks per level, the run plan's headline), one line per start-up
phase with its time, one line per step with the metrics a researcher watches, real warnings and errors, and the final
summary. Everything else goes to files in ``<run>/logs/``, captured at the process level, whatever the library:

* ``driver.log``: the driver's file descriptors 1 and 2 (every library's prints and logging, subprocesses it starts
  such as the reward workers) and every log record;
* ``worker-<pid>.log``: each Ray worker's descriptors 1 and 2, redirected by :func:`redirect_worker_output` (Ray's
  ``worker_process_setup_hook``) with ``log_to_driver=False``. vLLM's engine processes inherit their server's.

A worker's exception reaches the driver as Ray's error, with the worker's traceback, and is printed on the console.
``MLMT_SHOW_ALL_LOGS=1`` keeps everything on the console (Ray forwards the workers' output, nothing is redirected).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

logger = logging.getLogger(__name__)

SHOW_ALL_ENV = "MLMT_SHOW_ALL_LOGS"
LOG_DIR_ENV = "MLMT_RUN_LOG_DIR"  # set in the Ray workers' environment: where redirect_worker_output writes
WORKER_HOOK = f"{__name__}.redirect_worker_output"
LEARNING_DOC = "docs/MEASUREMENTS.md (Learning tests)"
REAL_MODEL_DEMO = "bash recipes/learning_demo/run_learning_demo.sh"
RELAY_DEMO = "bash recipes/relay_demo/run_relay_demo.sh"  # both levels learning on a toy task, with a null control
GPU_DOC = "docs/GPU_RUN.md"
NOISE_SIGMAS = 2.0  # a change within this many standard errors is reported as within noise


def show_all() -> bool:
    return bool(os.environ.get(SHOW_ALL_ENV))


def redirect_worker_output() -> None:
    """Ray ``worker_process_setup_hook``: this worker's stdout and stderr (and its subprocesses') go to
    ``$MLMT_RUN_LOG_DIR/worker-<pid>.log``."""
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    _redirect_fds(Path(folder) / f"worker-{os.getpid()}.log")


def _redirect_fds(path: Path) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def ray_settings(log_dir: Path) -> tuple[dict, dict]:
    """(extra ``ray.init`` arguments, extra ``runtime_env`` entries) that send the workers' output to ``log_dir``;
    nothing under ``MLMT_SHOW_ALL_LOGS=1``."""
    if show_all():
        return {}, {}
    return {"log_to_driver": False}, {"worker_process_setup_hook": WORKER_HOOK, "env_vars": {LOG_DIR_ENV: str(log_dir)}}


class ConsoleFilter(logging.Filter):
    """What the console shows: warnings and errors (minus known library noise), and the project's INFO lines except
    those logged with ``extra={"console": False}`` (kept in ``driver.log``)."""

    def __init__(self) -> None:
        super().__init__()
        from agent_system.log_filter import KnownNoiseFilter

        self.noise = KnownNoiseFilter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return self.noise.filter(record)
        return (
            record.levelno >= logging.INFO
            and record.name.startswith("agent_system")
            and getattr(record, "console", True)
        )


class _Tee:
    """A text stream writing to two streams (the console and the driver's log)."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.streams[0], name)


class RunConsole:
    """Sends the driver's output to ``<out_dir>/logs/driver.log`` and keeps a filtered console (a context manager).

    Inside :meth:`training`, Python-level prints (verl's ``console`` metrics logger) reach both the console and the
    log. On an exception the traceback is written to the log, the descriptors are restored and the exception goes on
    (Python prints it on the console).
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.log_dir = Path(out_dir) / "logs"
        self.enabled = not show_all()
        self.terminal: TextIO | None = None
        self._saved: tuple[int, int] | None = None
        self._handler: logging.Handler | None = None

    def __enter__(self) -> RunConsole:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.enabled:
            return self
        self._saved = (os.dup(1), os.dup(2))
        self.terminal = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
        handler = logging.StreamHandler(self.terminal)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        handler.addFilter(ConsoleFilter())
        root = logging.getLogger()
        if not root.handlers:  # no Hydra: the records still reach driver.log through stderr
            root.addHandler(logging.StreamHandler(sys.stderr))
        root.addHandler(handler)
        self._handler = handler
        _redirect_fds(self.log_dir / "driver.log")
        logger.info("workers', servers' and libraries' output: %s (MLMT_SHOW_ALL_LOGS=1 shows it here)", self.log_dir)
        return self

    def __exit__(self, kind, error, trace) -> None:
        if not self.enabled or self._saved is None:
            return
        if error is not None and not isinstance(error, SystemExit):
            traceback.print_exception(kind, error, trace, file=sys.stderr)  # into driver.log; the console gets it next
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        logging.getLogger().removeHandler(self._handler)
        self.terminal.close()
        self._saved = None

    def training(self) -> _Stdout:
        """Context: Python prints go to the console and the log (verl's per-step ``console`` metrics line)."""
        return _Stdout(self.terminal)


class _Stdout:
    def __init__(self, terminal: TextIO | None) -> None:
        self.terminal, self.saved = terminal, None

    def __enter__(self) -> None:
        if self.terminal is not None:
            self.saved = sys.stdout
            sys.stdout = _Tee(self.terminal, sys.stdout)

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            sys.stdout.flush()
            sys.stdout = self.saved


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A start-up phase: one console line with its time when it ends without error."""
    start = time.perf_counter()
    yield
    logger.info("start-up: %s took %.1f s", name, time.perf_counter() - start)


def startup_summary(plan, config, device: str) -> list[str]:
    """Models, ranks per level and the run plan's headline (the full plan is in ``run_plan.md``)."""
    lines = [
        f"run: {plan.total_steps} steps ({plan.steps_from}), schedule {plan.schedule}, validation at steps "
        f"{', '.join(map(str, plan.validation_steps)) or 'none'}, checkpoints at "
        f"{', '.join(map(str, plan.checkpoint_steps)) or 'none'}; full plan: "
        f"{Path(config.trainer.default_local_dir) / 'run_plan.md'}"
    ]
    for level in plan.levels.values():
        state = "frozen" if level.frozen else f"updated on {level.updates} steps"
        lr = "" if level.lr is None else f", lr {level.lr.peak:.3g}"
        lines.append(
            f"{level.level.upper()}: {level.model} on {level.world_size} {device} rank(s), {state}{lr}, "
            f"{level.samples_per_step} generations per step"
        )
    return lines


def step_line(step: int, total: int, metrics: dict[str, float], seconds: float) -> str | None:
    """One console line per step: accuracies, flips, per-level reward, KL and share of groups with a learning signal,
    seconds; None for other records."""

    def value(key: str, fmt: str = ".3f") -> str | None:
        return None if key not in metrics else format(metrics[key], fmt)

    prefix = "train" if "train/acc@t1" in metrics else "val" if "val/acc@t1" in metrics else None
    if prefix is None:
        return None
    parts = [
        f"{name} {value(f'{prefix}/{key}')}"
        for name, key in (("acc@t1", "acc@t1"), ("acc@t3", "acc@t3"), ("Δi→c", "delta_i2c"), ("Δc→i", "delta_c2i"))
        if f"{prefix}/{key}" in metrics
    ]
    for level in ("ll", "hl"):
        if f"{level}/reward_mean" in metrics:
            signal = value(f"{level}/groups_with_signal", ".0%")  # share of groups with a non-zero advantage
            parts.append(
                f"{level.upper()} reward {value(f'{level}/reward_mean')} KL {value(f'{level}/kl_mean', '.4f')}"
                + (f" signal {signal}" if signal else "")
            )
    if prefix == "train" and "val/acc@t1" in metrics:
        parts.append(
            f"val acc@t1 {value('val/acc@t1')}" + (f" acc@t3 {value('val/acc@t3')}" if "val/acc@t3" in metrics else "")
        )
    head = f"step {step}/{total}" if prefix == "train" else "validation before training"
    return f"{head} | {' | '.join(parts)} | {seconds:.1f} s"


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def progress(elapsed: float, steps_done: int, steps_left: int) -> str:
    """``elapsed h:mm:ss, ETA h:mm:ss``: the steps left at the mean time per step this process has taken so far
    (start-up before the first step not counted; validation and checkpoint steps included)."""
    eta = elapsed / max(steps_done, 1) * steps_left
    return f"elapsed {clock(elapsed)}, ETA {clock(eta)}"


class ConsoleTracker:
    """Wraps the trainer's tracker: every record is logged as before, and each step's also as one console line, with
    the run's elapsed time and an ETA (:func:`progress`): a Slurm log has no progress bar (no terminal)."""

    def __init__(self, tracker: Any, total_steps: int) -> None:
        self.tracker, self.total_steps = tracker, total_steps
        self.started = self.last = time.perf_counter()
        self.steps_timed = 0

    def log(self, data: dict, step: int, **kwargs: Any) -> None:
        self.tracker.log(data, step=step, **kwargs)
        now = time.perf_counter()
        line = step_line(step, self.total_steps, data, now - self.last)
        if line is not None:
            if "train/acc@t1" in data:
                self.steps_timed += 1
                line += f" | {progress(now - self.started, self.steps_timed, self.total_steps - step)}"
            logger.info("%s", line)
            self.last = now

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tracker, name)


# ---------------------------------------------------------------------------------------------------- final summary
@dataclass
class Accuracy:
    """One validation accuracy before and after training on ``problems`` problems, with its standard errors."""

    metric: str
    before: float
    after: float
    problems: int

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def standard_error(self) -> float:
        """Binomial standard error of the change, the two measurements taken as independent (conservative when
        they are on the same problems and positively correlated)."""
        return math.sqrt(sum(p * (1 - p) / self.problems for p in (self.before, self.after)))

    @property
    def within_noise(self) -> bool:
        return abs(self.change) <= NOISE_SIGMAS * self.standard_error

    def text(self) -> str:
        verdict = "within noise" if self.within_noise else "beyond noise"
        if self.standard_error == 0:
            verdict = "no change" if self.change == 0 else "beyond noise (no variance)"
        return (
            f"{self.metric} {self.before:.3f} → {self.after:.3f} on {self.problems} problems "
            f"(Δ {self.change:+.3f}, SE {self.standard_error:.3f}: {verdict}, bound {NOISE_SIGMAS:g} SE)"
        )


def no_signal_diagnosis(level: str, steps: list[dict]) -> str:
    """Why a level that updated never had a group with a non-zero advantage (its rows of every group scored alike),
    from the accuracy its groups are scored by and the share of turns cut at their token budget, and the lever."""
    key = "train/acc@t1" if level == "ll" else "train/acc@t3"
    accuracy = [h[key] for h in steps if key in h]
    cut = [h["train/truncated_share"] for h in steps if "train/truncated_share" in h]
    mean, cut_share = (sum(v) / len(v) if v else float("nan") for v in (accuracy, cut))
    more = "mlmt.n (attempts per problem)" if level == "ll" else "mlmt.m (feedbacks per attempt)"
    if mean <= 0.02:
        cause = f"every answer was wrong ({key} {mean:.3f}; {cut_share:.0%} of turns cut at their token budget)"
        lever = "easier problems, a larger data.max_response_length if turns are cut, or a stronger model"
    elif mean >= 0.98:
        cause, lever = f"every answer was right ({key} {mean:.3f})", "harder problems"
    else:
        cause = f"right and wrong answers fell in different groups ({key} {mean:.3f})"
        lever = f"larger groups ({more}) or a higher actor_rollout_ref.rollout.temperature"
    head = f"no learning signal at the {level.upper()}: every group's rows were scored alike, so every advantage was 0"
    return f"{head}: {cause}; lever: {lever}"


def final_summary(history: list[dict], first_val: dict | None, last_val: dict | None, val_rows: int, plan) -> list[str]:
    """Per level: updates, mean |advantage|, KL from the reference, the validation accuracy before and after (the
    LL's turn-1 accuracy, the HL's turn-3 accuracy, which its feedback leads to) with the number of problems and
    whether the change is within noise; then where to see both levels learn in minutes (the relay demo), where
    learning is measured, and how to run on a GPU."""
    lines = ["what the run did:"]
    accuracy_of = {"ll": "val/acc@t1", "hl": "val/acc@t3"}
    for level, level_plan in plan.levels.items():
        steps = [h for h in history if h.get(f"{level}/updated")]
        head = f"{level.upper()}: {len(steps)} update(s)"
        if level_plan.frozen:
            head += " (frozen)"
        signal = [h[f"{level}/groups_with_signal"] for h in steps if f"{level}/groups_with_signal" in h]
        if steps:
            advantage = sum(h.get(f"{level}/advantage_abs_mean", 0.0) for h in steps) / len(steps)
            head += f", mean |advantage| {advantage:.4f}"
            if signal:
                silent = sum(share == 0 for share in signal)
                head += f", groups with a learning signal {sum(signal) / len(signal):.0%} ({silent} step(s) with none)"
            if level_plan.reference.startswith("none"):
                head += ", KL from the reference: not measured (no reference model)"
            else:
                kl = [h[f"{level}/kl_mean"] for h in steps if f"{level}/kl_mean" in h]
                head += f", KL from the reference {sum(kl) / len(kl):.4f} mean, {kl[-1]:.4f} last"
        key = accuracy_of[level]
        if first_val and last_val and key in first_val and key in last_val and val_rows:
            head += "; " + Accuracy(key.removeprefix("val/"), first_val[key], last_val[key], val_rows).text()
        elif not first_val:
            head += "; no validation before training (trainer.val_before_train=false): accuracy change not measured"
        lines.append("  " + head)
        if signal and max(signal) == 0:
            lines.append("  " + no_signal_diagnosis(level, steps))
    lines.append(f"  to see both levels learn in a few minutes (tiny models, CPU, beside a null control): {RELAY_DEMO}")
    lines.append(f"  learning shown on tiny models (CPU): {LEARNING_DOC}; with SmolLM2: {REAL_MODEL_DEMO}")
    lines.append(f"  a GPU run: {GPU_DOC}")
    return lines
