"""The HL's leak penalty (docs/LEAK.md): ``mlmt.reward.leak_penalty`` is subtracted from the reward of every feedback
that states the answer (``StepScores.leak``, checked by ``agent_system.rewards.leak``).

Selected by ``mlmt.reward.leak_penalty > 0``; adds to the HL rows' ``extra_reward`` (with the confidence term's).
Refused before the workers start when no training row is a math task (:func:`check_math_rows`).
"""

from __future__ import annotations

from agent_system.config import ConfigError
from agent_system.rewards.leak import hl_leak_penalty
from agent_system.trainer.hooks import Extension


class LeakPenalty(Extension):
    """Minus the penalty on the HL rows whose feedback leaks the answer."""

    name = "leak_penalty"

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def check_data(self, frame, path) -> None:
        check_math_rows(frame, path, self.penalty)

    def level_inputs(self, trainer, level, step, rows, batch, inputs) -> dict[str, float]:
        if level == "hl" and step.scores.leak is not None:
            keys = {"problem": rows.keys.problem, "attempt": rows.keys.attempt, "feedback": rows.keys.feedback}
            inputs.extra_reward = hl_leak_penalty({"leak": step.scores.leak}, keys, self.penalty, inputs.extra_reward)
        return {}


def check_math_rows(frame, path, penalty: float) -> None:
    """The leak check reads the feedbacks on math rows only (code and YAML tasks: not applicable, docs/LEAK.md), so a
    penalty on training rows none of which is math never acts. Data sources the graders do not know are left to the
    data checks.

    Raises:
        ConfigError: No training row is a math task; names ``mlmt.reward.leak_penalty``, the file and its sources.
    """
    kinds = non_math_sources(frame)
    if kinds:
        raise ConfigError(
            f"mlmt.reward.leak_penalty={penalty} with data.train_files={path}: its rows are "
            f"{', '.join(f'{source} ({kind})' for source, kind in kinds.items())} tasks, whose feedbacks the leak "
            "check does not read (it finds stated math answers only: docs/LEAK.md), so the penalty never acts; set "
            "mlmt.reward.leak_penalty=0 or train on math rows"
        )


def non_math_sources(frame) -> dict[str, str]:
    """``{data_source: task kind}`` of the training rows when none is a math task (whose feedbacks the leak checks
    read), else {}; sources the graders do not know are left out (the data checks refuse them)."""
    from agent_system.rewards.scoring import task_kind

    kinds = {}
    for source in sorted({str(source) for source in frame["data_source"]}) if "data_source" in frame else []:
        try:
            kinds[source] = task_kind(source)
        except ValueError:
            continue
    return kinds if "math" not in kinds.values() else {}


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """``mlmt.reward.leak_penalty`` >= 0, and > 0 only where it is part of a trained HL's reward."""
    penalty, reward = config.mlmt.reward.leak_penalty, config.mlmt.reward
    if penalty < 0:
        return [f"mlmt.reward.leak_penalty={penalty}: must be >= 0 (0: off)"]
    if penalty > 0 and (frozen["hl"] or reward.hl_reward == "value_shaped"):
        return [
            f"mlmt.reward.leak_penalty={penalty} with {frozen['hl'] or 'mlmt.reward.hl_reward=value_shaped'}: the "
            "penalty is part of a trained HL's reward (not of value_shaped's), so it cannot act; set leak_penalty=0"
        ]
    return []


def extension(config) -> LeakPenalty | None:
    penalty = float(config.mlmt.reward.get("leak_penalty", 0.0) or 0.0)
    return LeakPenalty(penalty) if penalty > 0 else None
