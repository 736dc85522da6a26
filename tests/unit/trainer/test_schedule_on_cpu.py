"""The (tH, tL) update schedule: cycles of tL LL steps then tH HL steps, and frozen levels."""

import pytest
from omegaconf import OmegaConf

from agent_system.trainer.schedule import levels_to_update

NONE_FROZEN = {"ll": False, "hl": False}


def _run(t_high, t_low, steps, frozen=NONE_FROZEN):
    schedule = OmegaConf.create({"tH": t_high, "tL": t_low})
    return [levels_to_update(step, schedule, frozen) for step in range(1, steps + 1)]


def test_alternates_with_one_one():
    assert _run(1, 1, 6) == [["ll"], ["hl"], ["ll"], ["hl"], ["ll"], ["hl"]]


def test_rr_1_15_is_fifteen_ll_steps_then_one_hl_step():
    plan = _run(1, 15, 48)
    for cycle in range(3):
        block = plan[16 * cycle : 16 * (cycle + 1)]
        assert block == [["ll"]] * 15 + [["hl"]], f"cycle {cycle}"
    hl_steps = [step for step, levels in enumerate(plan, start=1) if levels == ["hl"]]
    assert hl_steps == [16, 32, 48]


def test_several_hl_steps_follow_the_ll_steps():
    assert _run(2, 3, 10) == [["ll"]] * 3 + [["hl"]] * 2 + [["ll"]] * 3 + [["hl"]] * 2


def test_zero_t_low_trains_only_the_hl():
    assert _run(1, 0, 5) == [["hl"]] * 5


def test_zero_t_high_trains_only_the_ll():
    assert _run(0, 1, 5) == [["ll"]] * 5


@pytest.mark.parametrize(("frozen_level", "other"), [("hl", "ll"), ("ll", "hl")])
def test_frozen_level_never_updates_and_the_other_keeps_its_steps(frozen_level, other):
    frozen = {frozen_level: True, other: False}
    plan = _run(1, 3, 12, frozen)
    assert all(frozen_level not in levels for levels in plan)
    unfrozen = _run(1, 3, 12)
    # the other level trains exactly at the steps it would have trained without the freeze
    for with_freeze, without in zip(plan, unfrozen, strict=True):
        assert with_freeze == ([other] if without == [other] else [])
    assert sum(levels == [other] for levels in plan) == (9 if other == "ll" else 3)


def test_schedule_is_periodic_over_long_runs():
    plan = _run(1, 15, 16 * 20)
    assert plan[:16] * 20 == plan
