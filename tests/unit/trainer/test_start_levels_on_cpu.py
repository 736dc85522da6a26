"""Start-up of the two levels (agent_system.trainer.main.start_policy_groups): under split placement both levels'
``init`` run at the same time, colocated levels one after the other, and an error in either level reaches the
caller once both have returned.

The groups here are recorders with PolicyGroup's ``init`` signature: what is tested is the driver's scheduling of the
two calls (PolicyGroup.init itself runs in every integration and e2e test).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from agent_system.trainer.main import start_policy_groups


class Recorder:
    def __init__(self, name: str, events: list, barrier: threading.Barrier | None = None, error: bool = False):
        self.name, self.events, self.barrier, self.error = name, events, barrier, error

    def init(self) -> None:
        self.events.append(("start", self.name))
        if self.barrier is not None:
            self.barrier.wait(timeout=5)  # broken (BrokenBarrierError) unless the other level is starting too
        time.sleep(0.05)
        self.events.append(("end", self.name))
        if self.error:
            raise RuntimeError(f"{self.name} rollout server failed to start")


def test_split_levels_start_together(caplog):
    events: list = []
    barrier = threading.Barrier(2)
    groups = {"ll": Recorder("ll", events, barrier), "hl": Recorder("hl", events, barrier)}
    with caplog.at_level(logging.INFO, logger="agent_system"):
        start_policy_groups(groups, together=True)
    assert [kind for kind, _ in events[:2]] == ["start", "start"], events
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("start-up: LL workers and rollout server took") for m in messages), messages
    assert any(m.startswith("start-up: HL workers and rollout server took") for m in messages), messages
    assert any(m.startswith("start-up: LL and HL started together took") for m in messages), messages


def test_colocated_levels_start_one_after_the_other():
    events: list = []
    groups = {"ll": Recorder("ll", events), "hl": Recorder("hl", events)}
    start_policy_groups(groups, together=False)
    assert events == [("start", "ll"), ("end", "ll"), ("start", "hl"), ("end", "hl")]


def test_an_error_in_one_level_is_raised_after_both_returned():
    events: list = []
    barrier = threading.Barrier(2)
    groups = {"ll": Recorder("ll", events, barrier), "hl": Recorder("hl", events, barrier, error=True)}
    with pytest.raises(RuntimeError, match="hl rollout server failed to start"):
        start_policy_groups(groups, together=True)
    assert sorted(events) == [("end", "hl"), ("end", "ll"), ("start", "hl"), ("start", "ll")]


def test_a_single_level_starts_alone():
    events: list = []
    start_policy_groups({"ll": Recorder("ll", events)}, together=True)
    assert events == [("start", "ll"), ("end", "ll")]
