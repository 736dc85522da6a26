"""The (tH, tL) update schedule: which levels train at a step (docs/METHOD.md, "Stages and schedules").

* (tH, tL) = (1, 1): both levels update on every step (the seed's ``HLT_LLT_RR_1_1``).
* Any other ratio follows the original's phase: with ``c = step mod (tL + tH)`` (steps start at 1), the LL updates
  when ``c < tL`` and the HL when ``c >= tL``. ``HLT_LLT_RR_1_15`` (tH = 1, tL = 15) updates the HL at steps 15,
  31, 47, ... and the LL on the others (the first cycle has 14 LL steps, as in the original). tH = 0 trains only
  the LL, tL = 0 only the HL.
* A frozen level never updates; the other level then trains on **every** step (the episodes of every step are
  generated anyway, so none is discarded). A level is frozen when it has no planned update
  (``config.frozen_levels``: ``mlmt.<level>.freeze``, no HL, or its period 0), and a level whose period is 0 is
  never returned whatever ``frozen`` says (start-up refuses a zero period beside a freeze of the other level).
"""

from __future__ import annotations


def levels_to_update(step: int, schedule, frozen: dict[str, bool]) -> list[str]:
    """Levels updated at 1-based ``step``: a subset of ``["ll", "hl"]``, LL first.

    Args:
        step: the 1-based global training step.
        schedule: ``mlmt.schedule`` (``tH``, ``tL``).
        frozen: ``{"ll": bool, "hl": bool}``, ``config.frozen_levels``.
    """
    t_high, t_low = int(schedule.tH), int(schedule.tL)
    periods = {"ll": t_low, "hl": t_high}
    trainable = [level for level in ("ll", "hl") if not frozen[level] and periods[level] > 0]
    if len(trainable) < 2:
        return trainable  # one level frozen: the other trains every step
    if t_high == 1 and t_low == 1:
        return ["ll", "hl"]
    return ["ll"] if step % (t_high + t_low) < t_low else ["hl"]


def update_steps(total: int, schedule, frozen: dict[str, bool]) -> dict[str, list[int]]:
    """The 1-based steps of a ``total``-step run on which each level is updated: ``{"ll": [...], "hl": [...]}``."""
    steps: dict[str, list[int]] = {"ll": [], "hl": []}
    for step in range(1, total + 1):
        for level in levels_to_update(step, schedule, frozen):
            steps[level].append(step)
    return steps
