"""The typed data that passes between the phases of one step: the step's scores, a level's rows and what the loop
measured for them (docs/ARCHITECTURE.md).

Shapes, stated once: B problems in the step, n attempts per problem (``mlmt.n``), m feedbacks (and refinements) per
attempt (``mlmt.m``; m = 0 with ``mlmt.feedback=none``), N rows of a level, R response tokens per row (padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from verl import DataProto

    from agent_system.rewards.leak import LeakVerdicts


@dataclass(frozen=True)
class StepScores:
    """Graded rewards of one step's episodes.

    Attributes:
        r1: (B, n) reward of each attempt (turn 1).
        r3: (B, n, m) reward of each refinement (turn 3); (B, n, 0) without refinements.
        r_ref_attempt: (B, n) reward of the no-feedback refinement of each attempt (the contrastive HL reward's
            ``contrastive_reference=no_feedback``), or None.
        r_ref_feedback: (B, n, m) reward of the lagged LL snapshot's refinement after each feedback
            (``contrastive_reference=lagged_snapshot``), or None.
        leak: (B, n, m) whether each feedback states the answer (1.0 / 0.0, NaN where the check does not apply;
            ``agent_system.rewards.leak``), or None without feedback turns.
        leak_check: What each verdict of ``leak`` is made of (its ``leak`` is that array; the rules', the leak
            judge's and the reader's verdicts), or None.
    """

    r1: np.ndarray
    r3: np.ndarray
    r_ref_attempt: np.ndarray | None = None
    r_ref_feedback: np.ndarray | None = None
    leak: np.ndarray | None = None
    leak_check: LeakVerdicts | None = None

    def __post_init__(self) -> None:
        b, n = self.r1.shape
        if self.r3.ndim != 3 or self.r3.shape[:2] != (b, n):
            raise ValueError(f"r3 has shape {self.r3.shape}; r1 is {self.r1.shape}, so r3 must be ({b}, {n}, m)")
        if self.r_ref_attempt is not None and self.r_ref_attempt.shape != (b, n):
            raise ValueError(f"r_ref_attempt has shape {self.r_ref_attempt.shape}, not ({b}, {n})")
        if self.r_ref_feedback is not None and self.r_ref_feedback.shape != self.r3.shape:
            raise ValueError(f"r_ref_feedback has shape {self.r_ref_feedback.shape}, not r3's {self.r3.shape}")
        if self.leak is not None and self.leak.shape != self.r3.shape:
            raise ValueError(f"leak has shape {self.leak.shape}, not r3's {self.r3.shape}")
        if self.leak_check is not None and self.leak_check.leak is not self.leak:
            raise ValueError("leak_check.leak must be the step's leak verdicts (StepScores.leak)")
        if self.r_ref_attempt is not None and self.r_ref_feedback is not None:
            raise ValueError("a step has one reference for R_ref: per attempt or per feedback, not both")

    @property
    def refinements(self) -> int:
        """m: refinements per attempt."""
        return self.r3.shape[2]

    def r_ref_of(self, keys: RowKeys) -> np.ndarray | None:
        """(N,) R_ref of each row (per feedback or per attempt), or None when the step has no reference."""
        if self.r_ref_feedback is not None:
            return self.r_ref_feedback[keys.problem, keys.attempt, keys.feedback]
        if self.r_ref_attempt is not None:
            return self.r_ref_attempt[keys.problem, keys.attempt]
        return None

    def r_ref_at(self, problem: int, attempt: int, feedback: int) -> float | None:
        """R_ref of one (problem, attempt, feedback), or None when the step has no reference."""
        if self.r_ref_feedback is not None:
            return float(self.r_ref_feedback[problem, attempt, feedback])
        if self.r_ref_attempt is not None:
            return float(self.r_ref_attempt[problem, attempt])
        return None


@dataclass(frozen=True)
class RowKeys:
    """Where each of a level's N rows comes from: (N,) integer arrays.

    ``turn``: 1 (attempt) or 3 (refinement) for the solver's rows, 2 (feedback) for the feedback writer's;
    ``problem``, ``attempt``, ``feedback``: indices into the step's (B, n, m) grid (``feedback`` 0 on turn-1 rows).
    """

    turn: np.ndarray
    problem: np.ndarray
    attempt: np.ndarray
    feedback: np.ndarray

    def __post_init__(self) -> None:
        for name in ("turn", "problem", "attempt", "feedback"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        sizes = {len(self.turn), len(self.problem), len(self.attempt), len(self.feedback)}
        if len(sizes) != 1:
            raise ValueError(f"row keys of different lengths: {sorted(sizes)}")

    def __len__(self) -> int:
        return len(self.turn)


@dataclass(frozen=True)
class LevelRows:
    """One level's rows, in batch order: LL = turn-1 and turn-3 rows, HL = turn-2 rows.

    ``prompts`` / ``responses`` / ``log_probs``: N token-id lists (the exact ids the rollout server read and returned)
    and the server's log-prob of each response token.
    """

    keys: RowKeys
    prompts: list[list[int]]
    responses: list[list[int]]
    log_probs: list[list[float]]

    @classmethod
    def of(cls, level: str, episodes: list) -> LevelRows:
        """Flatten the step's episodes into ``level``'s rows.

        Turn numbers are the MLMT ones whatever ``mlmt.feedback``: a self-correction (SCoRe's second attempt) is a
        turn-3 row, so it gets turn-3 rewards, groups and β (``mlmt.stages.beta_turn3``)."""
        turns, keys = [], []
        for episode in episodes:
            i = episode.problem_index
            for j, attempt in enumerate(episode.attempts):
                if level == "ll":
                    turns.append(attempt.attempt)
                    keys.append((1, i, j, 0))
                for k, refinement in enumerate(attempt.refinements):
                    turns.append(refinement.refinement if level == "ll" else refinement.feedback)
                    keys.append((3 if level == "ll" else 2, i, j, k))
        turn, problem, attempt, feedback = (list(column) for column in zip(*keys, strict=True))
        return cls(
            keys=RowKeys(turn=turn, problem=problem, attempt=attempt, feedback=feedback),
            prompts=[t.prompt_ids for t in turns],
            responses=[list(t.response_ids) for t in turns],  # an empty one: a masked placeholder (build_rows)
            log_probs=[list(t.log_probs) for t in turns],
        )

    def select(self, turn: int) -> LevelRows:
        """The rows of one turn, in order."""
        picked = np.flatnonzero(self.keys.turn == turn)
        return LevelRows(
            keys=RowKeys(*(getattr(self.keys, name)[picked] for name in ("turn", "problem", "attempt", "feedback"))),
            prompts=[self.prompts[i] for i in picked],
            responses=[self.responses[i] for i in picked],
            log_probs=[self.log_probs[i] for i in picked],
        )


@dataclass
class LevelInputs:
    """What the loop measured for a level's N rows, read by the advantage computation.

    Attributes:
        kl: (N,) sequence KL of each row to the level's reference (zeros without a reference model).
        response_mask: (N, R).
        values: (N, R) a value per response token for estimators that read one (a critic's, or a method's own
            per-row signal), or None.
        extra_reward: (N,) added to each row's task reward (e.g. the HL's confidence term), or None.
        features: per-row arrays (N,) that a registered task reward reads, by name (``advantages.TaskReward``).
    """

    kl: np.ndarray
    response_mask: torch.Tensor
    values: torch.Tensor | None = None
    extra_reward: np.ndarray | None = None
    features: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class StepData:
    """One step's problems (B dataset rows), episodes (B), scores and active stage, as the level phases read them."""

    problems: list[dict]
    episodes: list
    scores: StepScores
    stage: object  # advantages.Stage


@dataclass(frozen=True)
class LevelBatch:
    """A level's batch, built (log-probs, values, advantages) and handed to its update.

    Attributes:
        level: "ll" or "hl".
        data: verl's ``DataProto`` of the rows, with ``old_log_probs``, ``advantages``, ``returns`` (and
            ``ref_log_prob``, ``values``, the per-turn KL coefficient where they apply): what the workers read.
        metrics: what the build measured (rewards, advantages, KL, the rollout/actor log-prob gap, the methods'
            metrics), logged with the update's.
    """

    level: str
    data: DataProto
    metrics: dict[str, float]
