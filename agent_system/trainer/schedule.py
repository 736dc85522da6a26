"""The (tH, tL) update schedule: which levels train at a step (MLMT_SPEC §3.1).

* (tH, tL) = (1, 1): both levels update on every step (the seed's ``HLT_LLT_RR_1_1``).
* Any other ratio: cycles of tL + tH steps, LL first: steps 1..tL of a cycle update the LL, the next tH steps update
  the HL (``HLT_LLT_RR_1_15`` is tH = 1, tL = 15). tH = 0 trains only the LL, tL = 0 only the HL.
* A frozen level never updates; the other level then trains on **every** step (the episodes of every step are
  generated anyway, so none is discarded).
"""

from __future__ import annotations


def levels_to_update(step: int, schedule, frozen: dict[str, bool]) -> list[str]:
    """Levels updated at 1-based ``step``: a subset of ``["ll", "hl"]``, LL first.

    Args:
        step: the 1-based global training step.
        schedule: ``mlmt.schedule`` (``tH``, ``tL``).
        frozen: ``{"ll": bool, "hl": bool}``, the levels' ``freeze`` flags.
    """
    trainable = [level for level in ("ll", "hl") if not frozen[level]]
    if len(trainable) < 2:
        return trainable  # one level frozen: the other trains every step
    t_high, t_low = int(schedule.tH), int(schedule.tL)
    if t_high == 1 and t_low == 1:
        return ["ll", "hl"]
    position = (step - 1) % (t_high + t_low)
    return ["ll"] if position < t_low else ["hl"]
