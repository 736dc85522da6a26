"""How ``MLMTTrainer.train_levels`` orders the two levels' blocking worker calls (issue 8, defect 2).

The two levels' worker groups are separate (``placement=split``): their log-prob and update calls must run at the
same time, and every log-prob pass must still come before either update (the HL's confidence term scores the
LL's log-probs with this step's weights). Each level here is a stand-in that only records when its blocking calls
start and end (the real calls are Ray round trips; the e2e tests and ``benchmarks/bench_mlmt_step.py --compare
levels`` run them).
"""

import threading
import time

import pytest
from omegaconf import OmegaConf

from agent_system.methods.confidence import ConfidenceTerm
from agent_system.trainer.mlmt_trainer import MLMTTrainer
from agent_system.trainer.rows import LevelBatch

CALL_S = 0.3


class _RecordingLevel:
    def __init__(self, level, log, lock):
        self.level, self.log, self.lock = level, log, lock

    def call(self, what):
        start = time.perf_counter()
        time.sleep(CALL_S)  # a blocking round trip to this level's workers
        with self.lock:
            self.log.append((what, self.level, start, time.perf_counter()))

    def weights_changed(self):  # no call: the servers get the weights at their next wake-up (weight_sync.py)
        with self.lock:
            now = time.perf_counter()
            self.log.append(("changed", self.level, now, now))


def _trainer(placement="split", confidence_lambda=0.0):
    log, lock = [], threading.Lock()
    trainer = object.__new__(MLMTTrainer)
    trainer.global_step = 1
    trainer.mlmt = OmegaConf.create({"placement": placement, "reward": {"confidence_lambda": confidence_lambda}})
    trainer.groups = {level: _RecordingLevel(level, log, lock) for level in ("ll", "hl")}
    trainer.extensions = [ConfidenceTerm()] if confidence_lambda > 0 else []

    def build_level_batch(level, *args):
        trainer.groups[level].call("log_prob")
        return LevelBatch(level, None, {})

    def update_level(batch):
        trainer.groups[batch.level].call("update")
        return {f"{batch.level}/pg_loss": 0.0}

    trainer.build_level_batch, trainer.update_level = build_level_batch, update_level
    return trainer, log


def test_both_levels_run_concurrently_with_log_probs_before_updates():
    trainer, log = _trainer()
    timing = {}
    start = time.perf_counter()
    metrics = trainer.train_levels(["ll", "hl"], None, None, None, None, timing)
    elapsed = time.perf_counter() - start
    assert set(metrics) == {"ll/pg_loss", "hl/pg_loss"}
    assert elapsed < 2 * CALL_S + 0.25  # two phases side by side, not four calls in a row
    last_log_prob = max(end for what, _, _, end in log if what == "log_prob")
    first_update = min(start for what, _, start, _ in log if what == "update")
    assert last_log_prob <= first_update
    for what in ("log_prob", "update"):
        spans = [(s, e) for w, _, s, e in log if w == what]
        assert max(s for s, _ in spans) < min(e for _, e in spans), what  # the two levels' calls overlap
    assert {"log_prob_ll", "log_prob_hl", "update_ll", "update_hl"} <= set(timing)
    assert [what for what, _, _, _ in log].count("changed") == 2  # each updated level's servers await its weights


@pytest.mark.parametrize("levels", [["ll"], ["hl"]])
def test_one_level_only_touches_that_level(levels):
    trainer, log = _trainer()
    trainer.train_levels(levels, None, None, None, None, {})
    assert {level for _, level, _, _ in log} == set(levels)
    assert [what for what, _, _, _ in log] == ["log_prob", "update", "changed"]


def test_sequential_mode_runs_one_level_after_the_other():
    trainer, log = _trainer()
    start = time.perf_counter()
    trainer.train_levels(["ll", "hl"], None, None, None, None, {}, concurrent=False)
    assert time.perf_counter() - start >= 4 * CALL_S
    assert [level for _, level, _, _ in log] == ["ll"] * 3 + ["hl"] * 3


def test_colocated_levels_run_one_after_the_other():
    # colocated levels share worker processes: concurrent submissions could deadlock multi-rank collectives
    trainer, log = _trainer(placement="colocated")
    trainer.train_levels(["ll", "hl"], None, None, None, None, {})
    assert [level for _, level, _, _ in log] == ["ll"] * 3 + ["hl"] * 3


def test_confidence_term_keeps_log_prob_passes_apart_but_updates_concurrent():
    trainer, log = _trainer(confidence_lambda=0.1)
    trainer.train_levels(["ll", "hl"], None, None, None, None, {})
    log_probs = sorted((s, e) for w, _, s, e in log if w == "log_prob")
    assert log_probs[0][1] <= log_probs[1][0]  # one after the other
    updates = [(s, e) for w, _, s, e in log if w == "update"]
    assert max(s for s, _ in updates) < min(e for _, e in updates)
