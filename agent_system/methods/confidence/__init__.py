"""The HL's confidence term (docs/METHOD.md, "Turns and rewards"): feedback that makes the dataset's reference
solution likelier under the solver earns λ·clip(mean log p_LL(y*|x,z,g) − mean log p_LL(y*|x,z)), added to S2.

Selected by ``mlmt.reward.confidence_lambda > 0`` (clip: ``mlmt.reward.confidence_clip``); every training row needs
a non-empty ``extra_info.reference_solution`` (checked at start-up: :func:`check_reference_solutions`). The bonus
itself: :func:`confidence_bonus`; the context without feedback: :func:`context_without_feedback`. The term is added
to the HL rows' ``extra_reward``, whatever other method (the leak penalty) added to it before or after.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent_system.config import set_away_from_default
from agent_system.trainer.hooks import Extension


class ConfidenceTerm(Extension):
    """Scores the reference solution under the LL's pre-update weights, with and without each feedback."""

    name = "confidence"
    builds_first = True  # the HL's rows are scored by the LL's workers, before the LL updates

    def check_data(self, frame, path) -> None:
        check_reference_solutions(frame, path)

    def level_inputs(self, trainer, level, step, rows, batch, inputs) -> dict[str, float]:
        if level == "hl":
            terms = confidence_terms(trainer, step.problems, step.episodes, rows)
            inputs.extra_reward = terms if inputs.extra_reward is None else inputs.extra_reward + terms
        return {}


def check_reference_solutions(frame, path) -> None:
    """The confidence term scores ``extra_info.reference_solution``: every training row must have a non-empty one."""
    for position, extra in enumerate(frame["extra_info"] if "extra_info" in frame else [None] * len(frame)):
        reference = (extra or {}).get("reference_solution") if isinstance(extra, dict) else None
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError(
                f"{path}: row {position} has no extra_info.reference_solution, which mlmt.reward.confidence_lambda > 0 "
                "scores; add one to every row or set mlmt.reward.confidence_lambda=0"
            )


def confidence_bonus(
    logp_with_feedback: np.ndarray, logp_without_feedback: np.ndarray, weight: float, clip: float
) -> np.ndarray:
    """λ·clip(mean-token log p(y*|x,z,g) − mean-token log p(y*|x,z)): feedback that makes the reference likelier."""
    return weight * np.clip(logp_with_feedback - logp_without_feedback, -clip, clip)


def context_without_feedback(prompts: Any, task: Any, attempt: str, tokenizer: Any, budget: int) -> Any:
    """The turn-3 prompt with the feedback removed: the same ``refine`` template with an empty feedback, so that the
    two contexts differ by the feedback alone (``refine_no_feedback`` is another instruction: "check your attempt").

    Where the turn-3 prompt had to shorten the attempt to make room for the feedback, this one shortens it only as
    far as its own budget needs.
    """
    return prompts.refine(task, attempt, "", tokenizer, budget)


def confidence_terms(trainer: Any, problems: list[dict], episodes: list, rows) -> np.ndarray:
    """Per HL row: λ·clip(mean log p_LL(y*|x,z,g) − mean log p_LL(y*|x,z)), y* = the dataset's reference.

    The prompt with feedback is the turn-3 prompt the LL already saw; the one without feedback
    (:func:`context_without_feedback`) and the tokenized reference are built once per attempt and per problem. Both
    sets are scored in one ``compute_log_prob``.
    """
    from agent_system.trainer.packing import build_rows, padding_id

    tokenizer, prompts = trainer.tokenizers["ll"], trainer.runner.prompts
    limit, budget = trainer.config.data.max_response_length, trainer.config.data.max_prompt_length
    references, no_feedback = {}, {}
    with_feedback, without_feedback, targets = [], [], []
    for i, j, k in zip(
        rows.keys.problem.tolist(), rows.keys.attempt.tolist(), rows.keys.feedback.tolist(), strict=True
    ):
        episode, attempt = episodes[i], episodes[i].attempts[j]
        if i not in references:
            reference = (problems[i].get("extra_info") or {}).get("reference_solution") or ""
            references[i] = tokenizer(reference, add_special_tokens=False)["input_ids"][:limit]
            if not references[i]:  # checked at data load; never score a placeholder token instead
                raise ValueError(f"problem {problems[i]['prompt'][0]['content']!r}: empty reference_solution")
        if (i, j) not in no_feedback:
            no_feedback[i, j] = context_without_feedback(
                prompts, episode.task, attempt.attempt.text, tokenizer, budget
            ).ids
        targets.append(references[i])
        with_feedback.append(attempt.refinements[k].refinement.prompt_ids)
        without_feedback.append(no_feedback[i, j])
    batch = build_rows(with_feedback + without_feedback, targets + targets, padding_id(tokenizer))
    log_probs, _ = trainer.groups["ll"].compute_log_prob(batch)  # (2N, R)
    mask = batch.batch["response_mask"].float()
    mean_logp = ((log_probs * mask).sum(-1) / mask.sum(-1)).numpy()  # (2N,)
    reward, count = trainer.mlmt.reward, len(targets)
    return confidence_bonus(mean_logp[:count], mean_logp[count:], reward.confidence_lambda, reward.confidence_clip)


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """``mlmt.reward.confidence_lambda`` / ``confidence_clip`` in range, the clip set only with the term on, and the
    term only where the HL trains."""
    reward = config.mlmt.reward
    if reward.confidence_lambda < 0 or reward.confidence_clip <= 0:
        return ["mlmt.reward.confidence_lambda must be >= 0 and mlmt.reward.confidence_clip > 0"]
    unread = [] if reward.confidence_lambda > 0 else set_away_from_default(config, ["mlmt.reward.confidence_clip"])
    if unread:
        return [
            f"{unread[0]} with mlmt.reward.confidence_lambda=0: the clip of the confidence term, which λ = 0 turns "
            "off, so it cannot act; unset it or set confidence_lambda > 0"
        ]
    if reward.confidence_lambda > 0 and config.mlmt.feedback == "model" and frozen["hl"]:
        return [
            f"mlmt.reward.confidence_lambda={reward.confidence_lambda} with {frozen['hl']}: the confidence term is "
            "part of the HL's reward, and the HL is never updated; set confidence_lambda=0"
        ]
    return []


def extension(config) -> ConfidenceTerm | None:
    return ConfidenceTerm() if config.mlmt.reward.get("confidence_lambda", 0) > 0 else None
