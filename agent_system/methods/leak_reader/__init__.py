"""The reader test of the HL's feedbacks (issue 44; docs/LEAK.md, "The reader test"): what the solver can read.

For each math feedback of a training step, the LL's reference model scores the gold as an immediate answer after the
refine prompt with the feedback and with a neutral feedback (:mod:`agent_system.rewards.leak_reader`); a feedback
whose gain reaches ``mlmt.reward.leak_reader_threshold`` nats leaks, however it is phrased. The verdict joins the
leak check's (a leak when either says so), so it reaches ``train/leak_rate`` and the leak penalty; its own metrics
are ``train/leak_reader_rate``, ``train/leak_reader_gain_mean`` and ``train/leak_reader_read``.

Selected by ``mlmt.reward.leak_reader``: ``auto`` (the default) where the LL has a reference model loaded
(:func:`agent_system.config.reference_needed`) and there is an HL; ``true`` demands it (refused where it cannot act:
no HL, no LL reference, no math training row); ``false`` off. Not run while validating (the rollout servers hold the
devices then), so ``val/leak_rate`` is the rules' (and the judge's).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agent_system.config import ConfigError, has_hl, reference_needed, set_away_from_default
from agent_system.methods.leak_penalty import non_math_sources
from agent_system.rewards import leak
from agent_system.rewards.leak_reader import reader_rows, reader_verdicts
from agent_system.trainer.hooks import Extension


class LeakReader(Extension):
    """Joins the reader test's verdicts into each training step's leak verdicts."""

    name = "leak_reader"

    def __init__(self, threshold: float, demanded: bool) -> None:
        self.threshold, self.demanded = threshold, demanded

    def check_data(self, frame, path) -> None:
        kinds = non_math_sources(frame) if self.demanded else {}
        if kinds:
            raise ConfigError(
                f"mlmt.reward.leak_reader=true with data.train_files={path}: its rows are "
                f"{', '.join(f'{source} ({kind})' for source, kind in kinds.items())} tasks, which have no gold "
                "answer for the solver to read, so the reader test never acts; set mlmt.reward.leak_reader=auto or "
                "false, or train on math rows"
            )

    def after_scores(self, trainer, problems, episodes, scores):
        if scores.leak_check is None:
            return scores
        gains = feedback_gains(trainer, problems, episodes)  # (B, n, m)
        check = leak.with_reader(scores.leak_check, gains, reader_verdicts(gains, self.threshold))
        return dataclasses.replace(scores, leak=check.leak, leak_check=check)


def feedback_gains(trainer, problems: list[dict], episodes: list) -> np.ndarray:
    """(B, n, m) gain in nats of each feedback under the LL's reference model, NaN on rows the leak check does not
    read (code and YAML tasks). Every feedback row and one neutral row per attempt (the neutral prompt does not depend
    on the feedback, so the m feedbacks on an attempt share it) go in one ``compute_ref_log_prob``."""
    from agent_system.trainer.packing import build_rows, padding_id

    tokenizer, prompts = trainer.tokenizers["ll"], trainer.runner.prompts
    budget = trainer.config.data.max_prompt_length
    shape = (len(episodes), len(episodes[0].attempts), len(episodes[0].attempts[0].refinements))
    gains, cells, rows, neutral_of, neutrals = np.full(shape, np.nan), [], [], [], []
    for i, (row, episode) in enumerate(zip(problems, episodes, strict=True)):
        if not leak.applies_to(row["data_source"]):
            continue
        gold = str(row["reward_model"]["ground_truth"])
        for j, attempt in enumerate(episode.attempts):
            for k, refinement in enumerate(attempt.refinements):
                text = refinement.feedback.text
                rows.append(reader_rows(prompts, episode.task, attempt.attempt.text, text, gold, tokenizer, budget))
                if k == 0:
                    neutrals.append(rows[-1])
                cells.append((i, j, k))
                neutral_of.append(len(neutrals) - 1)
    if not rows:
        return gains
    scored = [(r.with_feedback, r.answer) for r in rows] + [(r.neutral, r.answer) for r in neutrals]
    batch = build_rows([p for p, _ in scored], [a for _, a in scored], padding_id(tokenizer))
    log_probs = trainer.groups["ll"].compute_ref_log_prob(batch)  # (N + attempts, R)
    sums = (log_probs * batch.batch["response_mask"].float()).sum(-1).numpy()
    with_feedback, neutral = sums[: len(rows)], sums[len(rows) :]
    for cell, own, index in zip(cells, with_feedback, neutral_of, strict=True):
        gains[cell] = own - neutral[index]
    return gains


def reader_on(config) -> bool:
    """Whether the run has the reader test: ``true``, or ``auto`` with an HL and an LL reference model."""
    setting = config.mlmt.reward.leak_reader
    if setting == "auto":
        return has_hl(config) and reference_needed(config)["ll"]
    return setting is True


def config_errors(config, frozen: dict[str, str]) -> list[str]:
    """``mlmt.reward.leak_reader`` one of auto / true / false, and true only where it can act; the threshold > 0 and
    set only with the reader on."""
    reward = config.mlmt.reward
    setting, threshold = reward.leak_reader, reward.leak_reader_threshold
    if setting != "auto" and not isinstance(setting, bool):
        return [f"mlmt.reward.leak_reader={setting!r}: choose auto, true or false"]
    if threshold <= 0:
        return [f"mlmt.reward.leak_reader_threshold={threshold}: a gain in nats, must be > 0"]
    if setting is True and not has_hl(config):
        return [f"mlmt.reward.leak_reader=true with mlmt.feedback={config.mlmt.feedback}: no HL feedback to read"]
    if setting is True and not reference_needed(config)["ll"]:
        why = frozen["ll"] or "no β > 0 on turn 1 or 3, no actor_rollout_ref.actor.use_kl_loss"
        return [
            f"mlmt.reward.leak_reader=true: the solver (LL) has no reference model loaded ({why}), which the reader "
            "test scores with; set mlmt.reward.leak_reader=auto (on where one is loaded) or false"
        ]
    unread = [] if reader_on(config) else set_away_from_default(config, ["mlmt.reward.leak_reader_threshold"])
    if unread:
        return [
            f"{unread[0]} with mlmt.reward.leak_reader={setting} (off in this run: it needs an HL and an LL reference "
            "model): the threshold cannot act; unset it"
        ]
    return []


def extension(config) -> LeakReader | None:
    if not reader_on(config):
        return None
    return LeakReader(float(config.mlmt.reward.leak_reader_threshold), config.mlmt.reward.leak_reader is True)
