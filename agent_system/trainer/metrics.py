"""Episode metrics (SCoRe's names), trajectory records and the end-of-run plot."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from agent_system.rewards.leak import check_metrics, leak_rates
from agent_system.trainer.rows import StepScores

logger = logging.getLogger(__name__)


def episode_metrics(episodes, scores: StepScores, prefix: str) -> dict[str, float]:
    """acc@t1, acc@t3, Δ(t1,t3), Δi→c, Δc→i, final_acc (the last answer's accuracy: acc@t3, or acc@t1 without
    refinements), lengths, truncation and prompt-shortening counts of a batch.

    ``shortened_prompts`` counts the turn-2/3 prompts whose quotes (attempt, feedback, execution result) were shortened
    to fit ``data.max_prompt_length``; ``omitted_quote_tokens`` is the number of tokens they left out. Without feedback
    turns (``mlmt.feedback=self``) the HL length is absent; without refinements (``mlmt.feedback=none``) so are the
    turn-3 metrics.
    """
    r1, r3 = scores.r1, scores.r3  # (B, n), (B, n, m)
    attempts = [a for e in episodes for a in e.attempts]
    feedbacks = [r.feedback for a in attempts for r in a.refinements if r.feedback is not None]
    refinements = [r.refinement for a in attempts for r in a.refinements]
    turns = [a.attempt for a in attempts] + feedbacks + refinements
    metrics = {
        "acc@t1": float(r1.mean()),
        "ll_attempt_length": float(np.mean([len(a.attempt.response_ids) for a in attempts])),
        "truncated_turns": float(sum(t.truncated for t in turns)),
        "truncated_share": float(np.mean([t.truncated for t in turns])),
        "shortened_prompts": float(sum(t.shortened for t in turns)),
        "omitted_quote_tokens": float(sum(t.prompt.omitted_tokens for t in turns)),
        "generated_tokens": float(sum(len(t.response_ids) for t in turns)),
    }
    if r3.size:
        first = np.repeat(r1[:, :, None], r3.shape[2], axis=2) > 0.5
        final = r3 > 0.5
        metrics.update(
            {
                "acc@t3": float(r3.mean()),
                "delta_t1_t3": float(r3.mean() - r1.mean()),
                "delta_i2c": float((~first & final).mean()),
                "delta_c2i": float((first & ~final).mean()),
                "ll_refinement_length": float(np.mean([len(t.response_ids) for t in refinements])),
            }
        )
        if scores.leak is not None:  # leak_rate, leak_rate_i2c, ...: feedbacks stating the answer
            metrics.update(leak_rates(scores.leak, first, final))
        if scores.leak_check is not None:  # the leak judge's and the reader test's share in the verdicts
            metrics.update(check_metrics(scores.leak_check))
    metrics["final_acc"] = metrics.get("acc@t3", metrics["acc@t1"])  # the last answer's, whatever the turns
    if feedbacks:
        metrics["hl_feedback_length"] = float(np.mean([len(t.response_ids) for t in feedbacks]))
    if scores.r_ref_feedback is not None:  # the lagged LL snapshot on the same prompts
        metrics["acc@t3_snapshot"] = float(scores.r_ref_feedback.mean())
    if scores.r_ref_attempt is not None:  # the LL's refinement without feedback
        metrics["acc@t3_no_feedback"] = float(scores.r_ref_attempt.mean())
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def trajectory_records(problems, episodes, scores: StepScores) -> list[dict]:
    """One JSON-able record per (attempt, feedback) pair: problem, attempt, feedback, refinement, R1, R3 (and R_ref
    with the contrastive HL reward), the three prompts as the models read them (``prompts``: solve, feedback, refine;
    quotes shortened to the budget show an elision marker), whether each turn was ``truncated`` (cut at its token
    budget), and for code tasks the ``execution_result`` of the attempt that the feedback prompt quotes.
    Self-correction records have feedback null; single-turn records (no refinement) hold the problem, the attempt, R1
    and the attempt's truncation."""
    records = []
    for row, episode in zip(problems, episodes, strict=True):
        for j, attempt in enumerate(episode.attempts):
            if not attempt.refinements:
                records.append(
                    {
                        "problem": episode.task.problem,
                        "ground_truth": str(row["reward_model"]["ground_truth"]),
                        "attempt": attempt.attempt.text,
                        "R1": float(scores.r1[episode.problem_index, j]),
                        "prompts": {"solve": attempt.attempt.prompt.text},
                        "truncated": {"attempt": attempt.attempt.truncated},
                    }
                )
            for k, refinement in enumerate(attempt.refinements):
                records.append(
                    {
                        "problem": episode.task.problem,
                        "ground_truth": str(row["reward_model"]["ground_truth"]),
                        "attempt": attempt.attempt.text,
                        "feedback": refinement.feedback.text if refinement.feedback is not None else None,
                        "refinement": refinement.refinement.text,
                        "R1": float(scores.r1[episode.problem_index, j]),
                        "R3": float(scores.r3[episode.problem_index, j, k]),
                        "prompts": {
                            "solve": attempt.attempt.prompt.text,
                            "feedback": refinement.feedback.prompt.text if refinement.feedback is not None else None,
                            "refine": refinement.refinement.prompt.text,
                        },
                        "truncated": {  # the turn used its whole token budget without a stop token
                            "attempt": attempt.attempt.truncated,
                            "feedback": refinement.feedback.truncated if refinement.feedback is not None else None,
                            "refinement": refinement.refinement.truncated,
                        },
                    }
                )
                if episode.task.kind == "code":
                    records[-1]["execution_result"] = attempt.execution
                if scores.leak is not None and not np.isnan(scores.leak[episode.problem_index, j, k]):
                    records[-1]["leak"] = bool(scores.leak[episode.problem_index, j, k])  # feedback states y*
                    check = scores.leak_check
                    if check is not None and check.judged is not None:
                        judged = check.judged[episode.problem_index, j, k]
                        records[-1]["leak_by"] = "judge" if judged else "rules"  # the leak judge answered, or not
                    if check is not None and check.reader is not None:
                        gain = check.reader_gain[episode.problem_index, j, k]
                        if not np.isnan(gain):
                            records[-1]["leak_reader_gain"] = float(gain)  # nats: log p(y*|g) − log p(y*|neutral)
                r_ref = scores.r_ref_at(episode.problem_index, j, k)
                if r_ref is not None:
                    records[-1]["R_ref"] = r_ref
    return records


def plot_history(history: list[dict], path: Path) -> str | None:
    """PNG of accuracy and flip rates over steps (train and validation)."""
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (acc_ax, flip_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("train/acc@t1", "-"), ("train/acc@t3", "-"), ("val/acc@t1", "--o"), ("val/acc@t3", "--o")):
        points = [(h["step"], h[key]) for h in history if key in h]
        if points:
            acc_ax.plot(*zip(*points, strict=True), style, label=key)
    acc_ax.set(xlabel="step", ylabel="accuracy", title="Accuracy at turn 1 and turn 3", ylim=(0, 1))
    acc_ax.legend()
    for key in ("train/delta_i2c", "train/delta_c2i"):
        points = [(h["step"], h[key]) for h in history if key in h]
        if points:
            flip_ax.plot(*zip(*points, strict=True), label=key)
    flip_ax.set(xlabel="step", ylabel="fraction of (attempt, refinement) pairs", title="Flips: i→c and c→i")
    flip_ax.legend()
    for axis in (acc_ax, flip_ax):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
