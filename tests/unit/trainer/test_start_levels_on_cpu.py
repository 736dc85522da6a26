"""Start-up of a run (agent_system.launcher.main): under split placement both levels' ``init`` run at the same time,
colocated levels one after the other, and an error in either level reaches the caller once both have returned; on an
existing cluster the driver waits until every node of the job (``trainer.nnodes``) has joined; a local Ray start is
retried only when its node timed out during start-up.

The groups here are recorders with PolicyGroup's ``init`` signature and the node lists stand in for ``ray.nodes``:
what is tested is the driver's scheduling of the calls (PolicyGroup.init runs in every integration and e2e test, and
the wait in the real two-node Slurm job, tests/integration/test_slurm_sbatch_on_cpu.py); ``FlakyRay`` stands in for
``ray`` to count the starts (a real node that misses Ray's wait: tests/integration/test_ray_start_retry_on_cpu.py).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from agent_system.launcher.main import RAY_NODE_START_TIMEOUT, start_local_ray, start_policy_groups, wait_for_nodes


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


class Joining:
    """``ray.nodes`` of a cluster whose nodes join one per call, up to ``total``."""

    def __init__(self, total: int):
        self.total, self.calls = total, 0

    def __call__(self) -> list[dict]:
        self.calls += 1
        return [{"Alive": True, "NodeID": str(i)} for i in range(min(self.calls, self.total))]


def test_the_driver_waits_for_every_node_of_the_job():
    nodes = Joining(total=2)
    alive = wait_for_nodes(2, nodes, timeout_s=5, poll_s=0.01)
    assert len(alive) == 2 and nodes.calls == 2  # the first look saw 1 node: it waited for the second


def test_nodes_that_never_join_are_an_error_naming_the_key():
    with pytest.raises(RuntimeError, match=r"trainer.nnodes=3, but only 2 Ray node\(s\) joined"):
        wait_for_nodes(3, Joining(total=2), timeout_s=0.05, poll_s=0.01)


class FlakyRay:
    """``ray.init`` raising the given errors in turn, then starting; records each call."""

    def __init__(self, *errors: Exception):
        self.errors, self.calls, self.shutdowns = list(errors), [], 0

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_node_start_time_out_is_retried_with_the_same_arguments(caplog):
    ray = FlakyRay(Exception(RAY_NODE_START_TIMEOUT + ". This could happen because ..."))
    with caplog.at_level(logging.WARNING, logger="agent_system"):
        start_local_ray(ray, num_cpus=3, include_dashboard=False)
    assert ray.calls == [{"address": "local", "num_cpus": 3, "include_dashboard": False}] * 2
    assert ray.shutdowns == 1
    assert "Ray's local node did not start (attempt 1 of 3" in caplog.text


def test_other_start_errors_and_the_last_time_out_are_raised():
    ray = FlakyRay(ValueError("bad num_cpus"))
    with pytest.raises(ValueError, match="bad num_cpus"):
        start_local_ray(ray, num_cpus=-1)
    assert len(ray.calls) == 1  # not retried
    ray = FlakyRay(*[Exception(RAY_NODE_START_TIMEOUT)] * 3)
    with pytest.raises(Exception, match=RAY_NODE_START_TIMEOUT):
        start_local_ray(ray, attempts=3)
    assert len(ray.calls) == 3
