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
    −c·log π_H(g)·∇V. V lives in another worker group, so that term is added to the critic's loss, bounded:
    loss_V = MSE + (−c)·agg(w·V(x, z, g)), with, per feedback, w = its mean token log-prob under the HL's
    pre-update weights minus the mean of that over the step's feedbacks, and agg verl's aggregation of the MSE
    (``critic.loss_agg_mode``), so that V(x, z, g) gets the weight the MSE gives that token.

    Why bounded so: the seed's weight, the summed log π_H(g), is always negative and grows with the feedback's
    length, and verl's MSE weighs each of a row's response tokens, not the row: the term pushed every V(x, z, g)
    down orders of magnitude harder than the MSE held it (issue 34: +3.0 against 2e-4 per turn-3 row), with no
    finite optimum in practice. The per-token mean makes the weight independent of the feedback's length;
    centring gives the term no net push on V's level (the weights sum to zero), so V stays R's estimate on average
    and the solver's baseline R − V is not shifted; aggregating like the MSE puts both on one scale: at one token
    their sum is minimised at V = R + c·w, within c·max|w| of the MSE's optimum. Each optimizer step normalises
    the term over its own mini-batch exactly as the MSE (verl's global mini-batch token count), whatever the split.

``symmetric_reward`` maps R to 2R − 1 (∈ {−1, +1} for 0/1 verifiers, the seed's symmetric reward) in both uses.
Pure functions, unit-tested without Ray; :func:`critic_loss` runs inside verl's ``TrainingWorker``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agent_system import verl_compat as vc
from agent_system.config import set_away_from_default

VALUE_GRADS = ("stop", "full")
HL_LOG_PROB_WEIGHT = "hl_log_prob_weight"  # per critic row: w on turn-3 rows, 0 elsewhere (full-grad)
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


def full_grad_weights(turn: np.ndarray, hl_mean_log_probs: np.ndarray) -> np.ndarray:
    """Per critic (LL) row: w = the feedback's mean token log-prob minus its mean over the step's feedbacks on
    turn-3 rows, 0 on turn-1 rows (module docstring).

    Args:
        turn: (N,) turn of each LL row; its turn-3 rows are in the order of the HL's rows (one per feedback).
        hl_mean_log_probs: (N3,) mean of the feedback's token log-probs, per HL row.
    """
    turn = np.asarray(turn)
    turn3 = turn == 3
    if int(turn3.sum()) != len(hl_mean_log_probs):
        raise ValueError(f"{int(turn3.sum())} turn-3 solver rows but {len(hl_mean_log_probs)} feedback rows")
    mean_log_probs = np.asarray(hl_mean_log_probs, dtype=np.float64)
    weights = np.zeros(len(turn), dtype=np.float64)
    weights[turn3] = mean_log_probs - mean_log_probs.mean()
    return weights


def hl_value_grad_term(
    config: Any, prompt_values: torch.Tensor, weights: torch.Tensor, response_mask: torch.Tensor, data
) -> torch.Tensor:
    """−agg(w·V(prompt)) over the rows of one micro-batch (the term per unit c): w·V on each row's first response
    token (the value of its last prompt token), aggregated with the value loss's own ``loss_agg_mode`` and
    normalisers."""
    loss_mat = torch.zeros(response_mask.shape, dtype=prompt_values.dtype, device=prompt_values.device)
    loss_mat[:, 0] = weights.detach().to(prompt_values.dtype) * prompt_values
    return -vc.agg_loss(
        loss_mat=loss_mat,
        loss_mask=response_mask,
        loss_agg_mode=config.loss_agg_mode,
        dp_size=data["dp_size"],
        batch_num_tokens=data["batch_num_tokens"],
        global_batch_size=data["global_batch_size"],
        loss_scale_factor=config.loss_scale_factor,
    )


def critic_loss(config: Any, model_output, data, dp_group=None, *, value_coef: float, value_grad: str):
    """verl's value loss (the MSE to R) plus, with ``value_grad=full``, the HL objective's bounded term in V
    (module docstring).

    Signature of verl's ``value_loss`` (set with ``TrainingWorker.set_loss_fn``), called once per micro-batch; the
    term is aggregated like verl's MSE over the global mini-batch (one optimizer step), so micro-batches add up.
    """
    loss, metrics = vc.value_loss(config, model_output, data, dp_group)
    if value_grad == "stop":
        metrics[EXTRA_LOSS_METRIC] = vc.Metric(aggregation="sum", value=0.0)
        return loss, metrics
    vpreds = vc.no_padding_2_padding(model_output["values"], data)  # (b, R)
    weights = data[HL_LOG_PROB_WEIGHT].to(vpreds.device)
    response_mask = data.select("response_mask").to_padded_tensor()["response_mask"].to(vpreds.device).bool()
    term = value_coef * hl_value_grad_term(config, vpreds[:, 0], weights, response_mask, data)
    metrics[EXTRA_LOSS_METRIC] = vc.Metric(aggregation="sum", value=float(term.detach()))  # micro-batches add up
    return loss + term, metrics


def config_errors(config: Any, frozen: dict[str, str]) -> list[str]:
    """Start-up checks of the value-shaping keys: contradictory or inert combinations, each naming its keys.

    ``frozen``: per level, why it has no planned update ("" when it has some): ``config.frozen_reasons``."""
    mlmt = config.mlmt
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
        feedbacks = config.data.train_batch_size * mlmt.n * mlmt.m
        if feedbacks < 2:
            errors.append(
                f"mlmt.value_shaping.value_grad=full with one feedback per step (data.train_batch_size="
                f"{config.data.train_batch_size}, mlmt.n={mlmt.n}, mlmt.m={mlmt.m}): the term's weights are centred "
                "over the step's feedbacks, so one feedback gets 0; use more problems, attempts or feedbacks"
            )
        if mlmt.schedule.tH != 1 or mlmt.schedule.tL != 1:
            errors.append(
                "mlmt.value_shaping.value_grad=full adds the HL objective's term to the critic's update, which runs "
                "with the solver's: both levels must update every step (mlmt.schedule.tH=1, mlmt.schedule.tL=1)"
            )
    if not shaped:  # value_coef is c of the shaped HL reward R3 + c·V, read by nothing else
        errors += [
            f"{key} acts only with mlmt.reward.hl_reward=value_shaped (c in R3 + c·V(x, z, g)); unset it"
            for key in set_away_from_default(config, ["mlmt.value_shaping.value_coef"])
        ]
    if shaping.symmetric_reward and not (baseline or shaped):
        errors.append(
            "mlmt.value_shaping.symmetric_reward=true acts only with mlmt.ll.adv_estimator=value_baseline or "
            "mlmt.reward.hl_reward=value_shaped"
        )
    return errors


def critic_weights(ll_batch: Any, hl_batch: Any) -> torch.Tensor:
    """(N,) :data:`HL_LOG_PROB_WEIGHT` of the solver's rows from the HL batch's pre-update feedback log-probs."""
    mask = hl_batch.batch["response_mask"].float()
    mean_log_probs = (hl_batch.batch["old_log_probs"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    weights = full_grad_weights(np.asarray(ll_batch.non_tensor_batch["turn"]), mean_log_probs.numpy())
    return torch.as_tensor(weights, dtype=torch.float32)


VALUE_STATS = {"mean": np.mean, "min": np.min, "max": np.max}


def level_metrics(
    level: str, values: torch.Tensor | None, returns: torch.Tensor, feedback_values: np.ndarray | None, mask
) -> dict[str, float]:
    """What the shaping put into a level's advantages, token-weighted like ``<level>/advantage_mean``.

    LL (value_baseline): ``ll/return_mean`` (R) and ``ll/value_baseline_mean`` (V(prompt)), so that
    advantage_mean = return_mean − value_baseline_mean. HL (value_shaped): ``hl/feedback_value_{mean,min,max}``,
    V(x, z, g) over the feedbacks (the full-grad term, centred over the step, moves the spread more than the mean).
    """
    mask = mask.float()
    tokens = mask.sum()
    if level == "hl":
        values = np.asarray(feedback_values, dtype=np.float64)
        return {f"hl/feedback_value_{name}": float(reduce(values)) for name, reduce in VALUE_STATS.items()}
    return {
        "ll/return_mean": float((returns * mask).sum() / tokens),
        "ll/value_baseline_mean": float((values[:, :1] * mask).sum() / tokens),
    }
