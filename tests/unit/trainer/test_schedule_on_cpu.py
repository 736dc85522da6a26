"""The (tH, tL) update schedule (docs/METHOD.md, "Stages and schedules"): (1, 1) = both levels every step; other
ratios run cycles of tL LL steps then tH HL steps in the original's phase (c = step mod (tL + tH): LL when c < tL); a
frozen level never updates and the other level then trains on every step."""

import pytest
from omegaconf import OmegaConf

from agent_system.trainer.schedule import levels_to_update, update_steps

NONE_FROZEN = {"ll": False, "hl": False}


def _run(t_high, t_low, steps, frozen=NONE_FROZEN):
    schedule = OmegaConf.create({"tH": t_high, "tL": t_low})
    return [levels_to_update(step, schedule, frozen) for step in range(1, steps + 1)]


def test_one_one_updates_both_levels_every_step():
    # the seed's HLT_LLT_RR_1_1: each level gets one update per step, not one every other step
    plan = _run(1, 1, 6)
    assert plan == [["ll", "hl"]] * 6
    assert sum("ll" in levels for levels in plan) == 6 and sum("hl" in levels for levels in plan) == 6


def _spec_levels(step, t_high, t_low):
    """The original's rule: c = global_step mod (tL + tH); LL when c < tL, HL when c >= tL (steps from 1)."""
    c = step % (t_low + t_high)
    return ["ll"] if c < t_low else ["hl"]


def test_equal_ratios_above_one_still_cycle():
    assert _run(2, 2, 8) == [["ll"], ["hl"], ["hl"], ["ll"]] * 2


def test_rr_1_15_updates_the_hl_at_the_originals_steps():
    # the original: the HL at steps 15, 31, 47 (not 16, 32, 48); every cycle after the first has 15 LL steps
    plan = _run(1, 15, 48)
    hl_steps = [step for step, levels in enumerate(plan, start=1) if levels == ["hl"]]
    assert hl_steps == [15, 31, 47]
    for cycle in range(2):
        block = plan[15 + 16 * cycle : 15 + 16 * (cycle + 1)]
        assert block == [["ll"]] * 15 + [["hl"]], f"cycle {cycle}"


@pytest.mark.parametrize(("t_high", "t_low"), [(1, 15), (1, 20), (5, 20), (1, 10), (2, 3), (1, 5), (3, 1)])
def test_every_ratio_follows_the_spec_formula(t_high, t_low):
    steps = 3 * (t_high + t_low) + 2
    assert _run(t_high, t_low, steps) == [_spec_levels(step, t_high, t_low) for step in range(1, steps + 1)]


def test_update_steps_lists_each_levels_steps():
    steps = update_steps(500, OmegaConf.create({"tH": 1, "tL": 15}), NONE_FROZEN)
    assert steps["hl"] == list(range(15, 501, 16)) and len(steps["hl"]) == 31
    assert len(steps["ll"]) == 469 and set(steps["ll"]).isdisjoint(steps["hl"])


def test_several_hl_steps_follow_the_ll_steps():
    assert _run(2, 3, 10) == [["ll"]] * 2 + [["hl"]] * 2 + [["ll"]] * 3 + [["hl"]] * 2 + [["ll"]]


def test_zero_t_low_trains_only_the_hl():
    assert _run(1, 0, 5) == [["hl"]] * 5


def test_zero_t_high_trains_only_the_ll():
    assert _run(0, 1, 5) == [["ll"]] * 5


@pytest.mark.parametrize(("t_high", "t_low"), [(1, 1), (1, 3), (1, 15), (2, 3), (1, 0), (0, 1)])
@pytest.mark.parametrize(("frozen_level", "other"), [("hl", "ll"), ("ll", "hl")])
def test_frozen_level_never_updates_and_the_other_trains_every_step(t_high, t_low, frozen_level, other):
    plan = _run(t_high, t_low, 12, {frozen_level: True, other: False})
    other_period = t_low if other == "ll" else t_high
    # a level whose period is 0 has no planned update: with the other frozen, nothing trains (start-up refuses it)
    assert plan == ([[other]] if other_period else [[]]) * 12


@pytest.mark.parametrize(("t_high", "t_low", "idle"), [(1, 0, "ll"), (0, 1, "hl")])
@pytest.mark.parametrize("frozen", [NONE_FROZEN, {"ll": True, "hl": False}, {"ll": False, "hl": True}])
def test_a_level_with_a_zero_period_is_never_trained(t_high, t_low, idle, frozen):
    # tL = 0 with mlmt.hl.freeze=true used to train the LL on every step (the one trainable level)
    assert not any(idle in levels for levels in _run(t_high, t_low, 40, frozen))


def test_schedule_is_periodic_over_long_runs():
    plan = _run(1, 15, 16 * 20)
    assert plan[:16] * 20 == plan and plan[14] == ["hl"]
