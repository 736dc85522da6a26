"""The run console (agent_system/launcher/console.py): the per-step line, the final summary's figures, and the driver's
output capture (a child process stands for the driver: what it leaves on its terminal is what a user sees)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_system.launcher.console import Accuracy, final_summary, no_signal_diagnosis, step_line

REPO = Path(__file__).resolve().parents[3]


def test_step_line_has_the_watched_metrics_and_skips_other_records():
    metrics = {
        "train/acc@t1": 0.25,
        "train/acc@t3": 0.5,
        "train/delta_i2c": 0.375,
        "train/delta_c2i": 0.125,
        "ll/reward_mean": 0.4,
        "ll/kl_mean": 0.0123,
        "hl/reward_mean": 0.5,
        "hl/kl_mean": 0.0,
        "ll/pg_loss": 3.0,
    }
    line = step_line(3, 10, metrics, 12.34)
    assert line == (
        "step 3/10 | acc@t1 0.250 | acc@t3 0.500 | Δi→c 0.375 | Δc→i 0.125 | LL reward 0.400 KL 0.0123 | "
        "HL reward 0.500 KL 0.0000 | 12.3 s"
    )
    assert step_line(0, 10, {"val/acc@t1": 0.5}, 1.0).startswith("validation before training | acc@t1 0.500")
    signal = step_line(3, 10, {**metrics, "ll/groups_with_signal": 0.5, "hl/groups_with_signal": 0.0}, 1.0)
    assert "LL reward 0.400 KL 0.0123 signal 50% | HL reward 0.500 KL 0.0000 signal 0% |" in signal
    assert step_line(4, 10, {"resume/ll_logprob_max_abs_diff": 0.0}, 1.0) is None


def test_each_step_line_has_the_elapsed_time_and_an_eta(monkeypatch, caplog):
    """A Slurm log has no progress bar: each step's line ends in the elapsed time and the ETA at the mean step time so
    far (was: the step's seconds only)."""
    from agent_system.launcher import console

    clock = iter([100.0, 130.0, 190.0, 200.0])  # start; step 3 after 30 s; step 4 after 60 s more; a non-step record
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    recorded = []
    tracker = console.ConsoleTracker(SimpleNamespace(log=lambda data, step: recorded.append(step)), total_steps=10)
    with caplog.at_level("INFO", logger=console.logger.name):
        tracker.log({"train/acc@t1": 0.5}, step=3)  # a resumed run: steps 1-2 were another process's
        tracker.log({"train/acc@t1": 0.5}, step=4)
        tracker.log({"resume/ll_logprob_max_abs_diff": 0.0}, step=4)
    lines = [r.getMessage() for r in caplog.records]
    assert recorded == [3, 4, 4] and len(lines) == 2
    assert lines[0].endswith("| 30.0 s | elapsed 0:00:30, ETA 0:03:30")  # 7 steps left at 30 s
    assert lines[1].endswith("| 60.0 s | elapsed 0:01:30, ETA 0:04:30")  # 6 left at 45 s


def test_accuracy_noise_verdict_is_two_binomial_standard_errors():
    wide = Accuracy("acc@t1", 0.25, 0.625, 16)
    se = math.sqrt(0.25 * 0.75 / 16 + 0.625 * 0.375 / 16)
    assert math.isclose(wide.standard_error, se)
    assert not wide.within_noise and "beyond noise" in wide.text()  # 0.375 > 2 · 0.162
    narrow = Accuracy("acc@t1", 0.25, 0.625, 8)  # 2 · 0.230 > 0.375
    assert narrow.within_noise and "within noise" in narrow.text() and "on 8 problems" in narrow.text()
    assert "no change" in Accuracy("acc@t3", 0.0, 0.0, 2).text()


def _plan(ll_reference: str, hl_frozen: bool):
    level = lambda name, frozen, reference: SimpleNamespace(level=name, frozen=frozen, reference=reference)  # noqa: E731
    return SimpleNamespace(levels={"ll": level("ll", False, ll_reference), "hl": level("hl", hl_frozen, "none")})


def test_final_summary_per_level():
    history = [
        {"step": 0, "val/acc@t1": 0.25, "val/acc@t3": 0.5},
        {"step": 1, "ll/updated": 1.0, "ll/advantage_abs_mean": 0.2, "ll/kl_mean": 0.01},
        {"step": 2, "ll/updated": 1.0, "ll/advantage_abs_mean": 0.4, "ll/kl_mean": 0.03},
    ]
    first, last = {"val/acc@t1": 0.25, "val/acc@t3": 0.5}, {"val/acc@t1": 0.75, "val/acc@t3": 0.5}
    lines = final_summary(history, first, last, 64, _plan("actor weights at step 0", hl_frozen=True))
    ll, hl = lines[1], lines[2]
    assert ll.startswith("  LL: 2 update(s), mean |advantage| 0.3000, KL from the reference 0.0200 mean, 0.0300 last")
    assert "acc@t1 0.250 → 0.750 on 64 problems" in ll and "beyond noise" in ll
    assert hl.startswith("  HL: 0 update(s) (frozen)") and "acc@t3 0.500 → 0.500 on 64 problems" in hl
    assert "docs/MEASUREMENTS.md" in lines[-2] and "bash recipes/learning_demo/run_learning_demo.sh" in lines[-2]
    assert lines[-1] == "  a GPU run: docs/GPU_RUN.md"
    assert (REPO / "recipes/learning_demo/run_learning_demo.sh").is_file()  # the command points at the recipe
    no_ref = final_summary(history, None, last, 64, _plan("none (no β > 0)", hl_frozen=False))
    assert "not measured (no reference model)" in no_ref[1] and "no validation before training" in no_ref[1]


def test_final_summary_names_the_share_of_groups_with_signal_and_diagnoses_none():
    """The main job on a fresh clone once printed ``mean |advantage| 0.0000`` and nothing else: the summary now names
    the share of groups with a learning signal, and a level that never had one gets the cause and the lever."""
    steps = [
        {"step": s, "ll/updated": 1.0, "ll/advantage_abs_mean": 0.0, "ll/kl_mean": 0.0, "ll/groups_with_signal": 0.0}
        | {"train/acc@t1": 0.0, "train/acc@t3": 0.0, "train/truncated_share": 0.85}
        for s in (1, 2)
    ]
    lines = final_summary(steps, None, None, 0, _plan("actor weights at step 0", hl_frozen=True))
    assert "groups with a learning signal 0% (2 step(s) with none)" in lines[1]
    assert lines[2].startswith("  no learning signal at the LL: every group's rows were scored alike")
    assert "every answer was wrong (train/acc@t1 0.000; 85% of turns cut at their token budget)" in lines[2]
    assert "data.max_response_length" in lines[2]
    mixed = [{**steps[0], "ll/groups_with_signal": 0.5}, steps[1]]
    lines = final_summary(mixed, None, None, 0, _plan("actor weights at step 0", hl_frozen=True))
    assert "groups with a learning signal 25% (1 step(s) with none)" in lines[1]
    assert not any("no learning signal" in line for line in lines)
    right = [{**h, "train/acc@t3": 1.0} for h in steps]
    assert "every answer was right (train/acc@t3 1.000); lever: harder problems" in no_signal_diagnosis("hl", right)
    apart = [{**h, "train/acc@t1": 0.5} for h in steps]
    assert "larger groups (mlmt.n (attempts per problem))" in no_signal_diagnosis("ll", apart)


def test_final_summary_points_at_the_relay_demo_whatever_the_run_showed():
    """A run that saw no learning signal (or a change within noise) shows nothing learn: the summary names the demo in
    which both levels learn in minutes, after any diagnosis, and the command is the recipe's script."""
    silent = [
        {"step": 1, "ll/updated": 1.0, "ll/advantage_abs_mean": 0.0, "ll/kl_mean": 0.0, "ll/groups_with_signal": 0.0}
    ]
    learning = [{**silent[0], "ll/advantage_abs_mean": 0.3, "ll/groups_with_signal": 0.5}]
    for history, diagnosed in ((silent, True), (learning, False)):
        lines = final_summary(history, None, None, 0, _plan("actor weights at step 0", hl_frozen=True))
        demo = [i for i, line in enumerate(lines) if "bash recipes/relay_demo/run_relay_demo.sh" in line]
        assert len(demo) == 1 and "both levels learn in a few minutes" in lines[demo[0]], lines
        diagnosis = [i for i, line in enumerate(lines) if "no learning signal at the LL" in line]
        assert len(diagnosis) == diagnosed and all(i < demo[0] for i in diagnosis), lines
    assert (REPO / "recipes/relay_demo/run_relay_demo.sh").is_file()


DRIVER = textwrap.dedent(
    """
    import logging, os, sys
    from agent_system.launcher.console import RunConsole
    logging.basicConfig(level=logging.INFO)
    with RunConsole(sys.argv[1]) as console:
        print("library print NOISE-1")
        os.system("echo subprocess NOISE-2")
        logging.getLogger("somelib").info("library info NOISE-3")
        logging.getLogger("agent_system.x").info("project line SHOWN-1")
        logging.getLogger("agent_system.x").info("detail NOISE-4", extra={"console": False})
        logging.getLogger("somelib").warning("a real warning SHOWN-2")
        with console.training():
            print("step:1 - metrics SHOWN-3")
        if sys.argv[2] == "raise":
            raise ValueError("boom SHOWN-4")
    """
)


def _driver(tmp_path, mode: str, **env) -> tuple[subprocess.CompletedProcess, str]:
    import os

    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MLMT_SHOW_ALL_LOGS": "", **env},
    )
    log = tmp_path / "logs" / "driver.log"
    return result, log.read_text() if log.exists() else ""


@pytest.mark.external
def test_driver_console_shows_project_lines_and_warnings_the_log_holds_everything(tmp_path):
    result, log = _driver(tmp_path, "ok")
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    for shown in ("SHOWN-1", "SHOWN-2", "SHOWN-3", str(tmp_path / "logs")):
        assert shown in console, console
    assert "NOISE" not in console, console
    for text in ("NOISE-1", "NOISE-2", "NOISE-3", "NOISE-4", "SHOWN-1", "SHOWN-2", "SHOWN-3"):
        assert text in log, log


@pytest.mark.external
def test_driver_exception_reaches_the_console_with_its_traceback(tmp_path):
    result, log = _driver(tmp_path, "raise")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ValueError: boom SHOWN-4" in result.stderr, result.stderr
    assert "ValueError: boom SHOWN-4" in log  # and in the log


@pytest.mark.external
def test_show_all_logs_keeps_everything_on_the_console(tmp_path):
    result, _ = _driver(tmp_path, "ok", MLMT_SHOW_ALL_LOGS="1")
    console = result.stdout + result.stderr
    assert all(f"NOISE-{i}" in console for i in (1, 2, 3, 4)), console
