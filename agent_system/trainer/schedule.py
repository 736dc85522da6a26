"""The (tH, tL) update schedule: which levels train at a step.

Cycles of tL + tH steps, LL first: steps 1..tL of a cycle update the LL, the next tH steps update the HL (the seed
scripts' ``HLT_LLT_RR_1_15`` is tH = 1, tL = 15). A frozen level never updates; the other level then trains every
step it would have, and the frozen level's turns are simply skipped.
"""

from __future__ import annotations


def levels_to_update(step: int, schedule, frozen: dict[str, bool]) -> list[str]:
    """Levels updated at 1-based ``step`` (a subset of ["ll", "hl"], LL first)."""
    t_high, t_low = int(schedule.tH), int(schedule.tL)
    position = (step - 1) % (t_high + t_low)
    level = "ll" if position < t_low else "hl"
    return [] if frozen[level] else [level]
