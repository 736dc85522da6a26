"""Bi-level value shaping (recipes/value_shaping): hrl-reasoning's MLMT variant (docs/METHOD.md, "Baselines").

One learned value V, the solver's (LL) value model (verl's critic, config section ``critic``; verl's value model
returns per-response-token values whose position 0 is the value at the last prompt token, i.e. V(prompt)):

* **Solver** (``mlmt.ll.adv_estimator=value_baseline``): every token of an LL row gets the advantage R − V(prompt),
  V detached: V(x) on turn-1 rows, V(x, z, g) on turn-3 rows. R is the verifier's reward on the refined answer ŷ
  (R3): a turn-3 row's own refinement; a turn-1 row's attempt z has m refinements, so its R is their mean. The
  critic is trained by verl's (clipped) value MSE to ``returns`` = R on every response token. This is the seed's
  (R − V)·(log π_L(z) + log π_L(ŷ)) plus (V − R)².
* **Feedback writer** (``mlmt.reward.hl_reward=value_shaped``): S2 = R3 + c·V(x, z, g), c = ``value_coef``. V is
  taken at the turn-3 state (x, z, g) the feedback leads to: the state after the HL's action, before the solver's
  refinement, which the LL's critic already values (the seed's V(x, z, g, ŷ) would need a value of a finished
  episode, whose best estimate is R itself).

  - ``value_grad=stop``: V enters S2 as a number (plain reward shaping); the critic's loss is the MSE alone.
  - ``value_grad=full``: the HL's policy loss −(R3 + c·V)·log π_H(g) also has a gradient w.r.t. V's parameters,
    −c·log π_H(g)·∇V. V lives in another worker group, so that term is added to the critic's loss:
    loss_V = MSE + (−c / N3)·Σ_rows stopgrad(log π_H(g_row))·V(x, z, g_row), over the N3 turn-3 rows of the
    critic's batch (one per feedback), log π_H(g) = the sum of the feedback's token log-probs under the HL's
    pre-update weights. This is the gradient of the HL's REINFORCE objective averaged over its rows (the seed's
    −mean(log π_H(g)·combined)); an HL estimator's normalisation (GRPO's group mean/std) is not differentiated.

    The critic takes one optimizer step per mini-batch of ``critic.ppo_mini_batch_size`` rows, k = rows /
    mini-batch size steps per epoch, and each step's MSE is the mean over its own mini-batch (an estimate of the
    whole batch's). The term is estimated the same way: a step sums (−c·k / N3)·log π_H(g)·V over the turn-3 rows
    it holds (:func:`step_weights`). That is exactly −c·mean over the step's own turn-3 rows when it holds its
    share N3/k of them (always with one mini-batch; with the trainer's row order, whole problems per mini-batch
    and no shuffling), and over the k steps of an epoch it averages to −c·mean over all N3 rows whatever the
    split.

``symmetric_reward`` maps R to 2R − 1 (∈ {−1, +1} for 0/1 verifiers, the seed's symmetric reward) in both uses.
Pure functions, unit-tested without Ray; :func:`critic_loss` runs inside verl's ``TrainingWorker``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agent_system import verl_compat as vc

VALUE_GRADS = ("stop", "full")
HL_LOG_PROB_WEIGHT = "hl_log_prob_weight"  # per critic row: log π_H(g)·k/N3 on turn-3 rows, 0 elsewhere (full-grad)
EXTRA_LOSS_METRIC = "critic/hl_value_grad_loss"  # the full-grad term of the critic's loss (0 with stop-grad)


def episode_reward(r: np.ndarray, symmetric: bool) -> np.ndarray:
    """R as the value shaping uses it: the verifier's score, or 2R − 1 with ``symmetric``."""
    r = np.asarray(r, dtype=np.float64)
    return 2.0 * r - 1.0 if symmetric else r


def solver_rewards(turn: np.ndarray, r3_of_row: np.ndarray, r3_of_attempt: np.ndarray, symmetric: bool) -> np.ndarray:
    """R of each LL row: the row's refinement's R3 on turn-3 rows, the mean R3 of the attempt's m refinements on
    turn-1 rows.

    Args:
        turn: (N,) 1 or 3.
        r3_of_row: (N,) R3 of the row's (problem, attempt, feedback) refinement.
        r3_of_attempt: (N, m) R3 of all refinements of the row's attempt.
        symmetric: map R to 2R − 1.
    """
    mean = np.asarray(r3_of_attempt, dtype=np.float64).mean(axis=1)
    return episode_reward(np.where(np.asarray(turn) == 1, mean, r3_of_row), symmetric)


def value_baseline_advantages(
    rewards: np.ndarray, values: torch.Tensor | None, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each (N, R): R − V(prompt) on every response token (V detached) and R as the critic's
    regression target on every response token."""
    if values is None:
        raise ValueError("mlmt.ll.adv_estimator=value_baseline needs the critic's values")
    mask = response_mask.to(torch.float32)
    reward = torch.as_tensor(rewards, dtype=torch.float32)[:, None]
    baseline = values.detach().to(torch.float32)[:, :1]  # V(prompt): position 0 is the last prompt token's value
    return (reward - baseline) * mask, reward * mask


def shaped_hl_scores(r3: np.ndarray, feedback_values: np.ndarray, value_coef: float, symmetric: bool) -> np.ndarray:
    """S2 = R + c·V(x, z, g) of each feedback (the same numbers for stop- and full-grad)."""
    if feedback_values is None:
        raise ValueError("mlmt.reward.hl_reward=value_shaped needs V(x, z, g) of each feedback")
    return episode_reward(r3, symmetric) + value_coef * np.asarray(feedback_values, dtype=np.float64)


def full_grad_weights(turn: np.ndarray, hl_log_probs: np.ndarray) -> np.ndarray:
    """Per critic (LL) row: log π_H(g)/N3 on turn-3 rows, 0 on turn-1 rows (the whole batch's −c·mean term; the
    critic's update rescales them per optimizer step with :func:`step_weights`).

    Args:
        turn: (N,) turn of each LL row; its turn-3 rows are in the order of the HL's rows (one per feedback).
        hl_log_probs: (N3,) sum of the feedback's token log-probs, per HL row.
    """
    turn = np.asarray(turn)
    turn3 = turn == 3
    if int(turn3.sum()) != len(hl_log_probs):
        raise ValueError(f"{int(turn3.sum())} turn-3 solver rows but {len(hl_log_probs)} feedback rows")
    weights = np.zeros(len(turn), dtype=np.float64)
    weights[turn3] = np.asarray(hl_log_probs, dtype=np.float64) / max(len(hl_log_probs), 1)
    return weights


def step_weights(weights: torch.Tensor, rows: int, mini_batch_size: int) -> torch.Tensor:
    """The :func:`full_grad_weights` of a batch of ``rows`` rows, scaled by k = rows / ``mini_batch_size`` so that
    each of the critic's k optimizer steps gets −c·mean of the term, not 1/k of it (module docstring)."""
    if rows % mini_batch_size:
        raise ValueError(f"{rows} critic rows do not split into mini-batches of {mini_batch_size}")
    return weights * (rows // mini_batch_size)


def hl_value_grad_term(prompt_values: torch.Tensor, weights: torch.Tensor, value_coef: float) -> torch.Tensor:
    """−c·Σ_rows weight·V(prompt) over the rows of one micro-batch: with the weights of :func:`step_weights`, the
    micro-batches of one optimizer step add up to −c·mean(log π_H(g)·V(x,z,g)) over the step's turn-3 rows."""
    return -value_coef * (weights.detach().to(prompt_values.dtype) * prompt_values).sum()


def critic_loss(config: Any, model_output, data, dp_group=None, *, value_coef: float, value_grad: str):
    """verl's value loss (the MSE to R) plus, with ``value_grad=full``, the HL objective's term in V.

    Signature of verl's ``value_loss`` (set with ``TrainingWorker.set_loss_fn``), called once per micro-batch. verl
    splits the critic's batch into mini-batches of ``critic.ppo_mini_batch_size`` rows, one optimizer step each
    (``critic.update_data``), and each mini-batch into micro-batches whose gradients add up and are averaged over
    the ``dp_size`` ranks; the term is scaled by ``dp_size`` like verl's own global-batch normalisation. With the
    rows' weights from :func:`step_weights`, each step's summed gradient is that of −c·mean over its turn-3 rows
    (module docstring).
    """
    loss, metrics = vc.value_loss(config, model_output, data, dp_group)
    if value_grad == "stop":
        metrics[EXTRA_LOSS_METRIC] = vc.Metric(aggregation="sum", value=0.0)
        return loss, metrics
    vpreds = vc.no_padding_2_padding(model_output["values"], data)  # (b, R)
    weights = data[HL_LOG_PROB_WEIGHT].to(vpreds.device)
    term = hl_value_grad_term(vpreds[:, 0], weights, value_coef) * data["dp_size"]
    metrics[EXTRA_LOSS_METRIC] = vc.Metric(aggregation="sum", value=float(term.detach()))  # micro-batches add up
    return loss + term, metrics


def config_errors(config: Any) -> list[str]:
    """Start-up checks of the value-shaping keys: contradictory or inert combinations, each naming its keys."""
    from agent_system.trainer.config import frozen_reasons

    mlmt, frozen = config.mlmt, frozen_reasons(config)
    shaping, errors = mlmt.value_shaping, []
    baseline = mlmt.ll.adv_estimator == "value_baseline"
    shaped = mlmt.reward.hl_reward == "value_shaped"
    if mlmt.hl.adv_estimator == "value_baseline":
        errors.append("mlmt.hl.adv_estimator=value_baseline: the value baseline is the solver's (mlmt.ll) only")
    if shaping.value_grad not in VALUE_GRADS:
        errors.append(f"mlmt.value_shaping.value_grad={shaping.value_grad!r}: choose one of {VALUE_GRADS}")
    if baseline:
        if mlmt.feedback == "none":
            errors.append(
                "mlmt.ll.adv_estimator=value_baseline uses R of the refined answer (turn 3): mlmt.feedback=none has "
                "none; set mlmt.feedback=model"
            )
        if frozen["ll"]:
            errors.append(f"mlmt.ll.adv_estimator=value_baseline with {frozen['ll']}: neither solver nor V trains")
        stages = mlmt.stages
        if 1 in stages.stage_ids or any(a != 0 for a in stages.alpha):
            errors.append(
                "mlmt.ll.adv_estimator=value_baseline rewards both turns with R (the refinement's reward), so "
                "mlmt.stages.stage_ids=1 and mlmt.stages.alpha cannot act; use stage_ids=[2] and alpha=[0.0]"
            )
    if shaped:
        if mlmt.feedback != "model":
            errors.append(f"mlmt.reward.hl_reward=value_shaped needs mlmt.feedback=model (got {mlmt.feedback})")
        if not baseline:
            errors.append(
                "mlmt.reward.hl_reward=value_shaped reads V, the solver's value model trained to R: set "
                "mlmt.ll.adv_estimator=value_baseline"
            )
        if shaping.value_coef == 0:
            errors.append("mlmt.value_shaping.value_coef=0 makes mlmt.reward.hl_reward=value_shaped exactly r3")
        if frozen["hl"] and mlmt.feedback == "model":
            errors.append(f"mlmt.reward.hl_reward=value_shaped with {frozen['hl']}: the shaped reward never acts")
    if shaping.value_grad == "full":
        if not shaped:
            errors.append("mlmt.value_shaping.value_grad=full acts only with mlmt.reward.hl_reward=value_shaped")
        if mlmt.schedule.tH != 1 or mlmt.schedule.tL != 1:
            errors.append(
                "mlmt.value_shaping.value_grad=full adds the HL objective's term to the critic's update, which runs "
                "with the solver's: both levels must update every step (mlmt.schedule.tH=1, mlmt.schedule.tL=1)"
            )
    if shaping.symmetric_reward and not (baseline or shaped):
        errors.append(
            "mlmt.value_shaping.symmetric_reward=true acts only with mlmt.ll.adv_estimator=value_baseline or "
            "mlmt.reward.hl_reward=value_shaped"
        )
    return errors


def critic_weights(ll_batch: Any, hl_batch: Any) -> torch.Tensor:
    """(N,) :data:`HL_LOG_PROB_WEIGHT` of the solver's rows from the HL batch's pre-update feedback log-probs."""
    hl_log_probs = (hl_batch.batch["old_log_probs"] * hl_batch.batch["response_mask"].float()).sum(-1)
    weights = full_grad_weights(np.asarray(ll_batch.non_tensor_batch["turn"]), hl_log_probs.numpy())
    return torch.as_tensor(weights, dtype=torch.float32)


def level_metrics(
    level: str, values: torch.Tensor | None, returns: torch.Tensor, feedback_values: np.ndarray | None, mask
) -> dict[str, float]:
    """What the shaping put into a level's advantages, token-weighted like ``<level>/advantage_mean``.

    LL (value_baseline): ``ll/return_mean`` (R) and ``ll/value_baseline_mean`` (V(prompt)), so that
    advantage_mean = return_mean − value_baseline_mean. HL (value_shaped): ``hl/feedback_value_mean``, the mean
    V(x, z, g) of the feedbacks (row mean).
    """
    mask = mask.float()
    tokens = mask.sum()
    if level == "hl":
        return {"hl/feedback_value_mean": float(np.mean(feedback_values))}
    return {
        "ll/return_mean": float((returns * mask).sum() / tokens),
        "ll/value_baseline_mean": float((values[:, :1] * mask).sum() / tokens),
    }
