"""Per-turn KL loss: each row's β times verl's per-token KL estimator, added to the actor's PPO loss.

``mlmt.stages.kl_in=loss`` (the default). A row's coefficient is its turn's β of the active stage
(``mlmt.stages.beta_turn1`` / ``beta_turn2`` / ``beta_turn3``, ``advantages.kl_coefficients``); the driver sends it with
the row as ``TURN_KL_COEF`` and the actor's loss becomes

    PPO loss  +  agg_t( β_row · kl(log π_t, log π_ref,t) )

with verl's ``kl_penalty`` estimator ``actor_rollout_ref.actor.kl_loss_type`` (``low_var_kl``: k3, bounded; k1, which
has no expected gradient, is refused at start-up: docs/METHOD.md, "KL estimators") and the actor's ``loss_agg_mode``.
It is verl's ``use_kl_loss`` term with one coefficient per row instead of one per run: the gradient is per token (each
token's own log-ratio), so its variance does not grow with the response length the way the sequence-KL advantage of
``kl_in=advantage`` does, and β = 0 leaves verl's loss untouched.

:class:`ActorWorker` is verl's ``ActorRolloutRefWorker`` with one registered call that wraps the worker's own loss
function, so the PPO part stays exactly verl's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from agent_system import verl_compat as vc

TURN_KL_COEF = "turn_kl_coef"  # per row: β of the row's turn in the active stage
LOSS_METRIC = "actor/turn_kl_loss"  # agg(β·kl): the term added to the loss


def turn_kl_loss(model_output, data, dp_group=None, *, base: Callable, kl_type: str):
    """``base`` (verl's ``ppo_loss`` bound to the worker's actor config) plus the per-row-β KL term.

    Same signature as verl's loss functions (``TrainingWorker.set_loss_fn``); ``data`` holds the micro-batch with
    ``ref_log_prob`` and ``TURN_KL_COEF`` (b,).
    """
    loss, metrics = base(model_output=model_output, data=data, dp_group=dp_group)
    config = base.keywords["config"]
    log_prob = vc.no_padding_2_padding(model_output["log_probs"], data)
    padded = data.select("response_mask", "ref_log_prob").to_padded_tensor()
    beta = data[TURN_KL_COEF].to(device=log_prob.device, dtype=log_prob.dtype)
    kld = vc.kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=kl_type)
    term = vc.agg_loss(
        loss_mat=beta[:, None] * kld,
        loss_mask=padded["response_mask"].to(bool),
        loss_agg_mode=config.loss_agg_mode,
        **config.global_batch_info,
    )
    metrics[LOSS_METRIC] = vc.Metric(value=term, aggregation=metrics["actor/pg_loss"].aggregation)
    return loss + term, metrics


class ActorWorker(vc.ActorRolloutRefWorker):
    """The project's actor/rollout/ref worker: verl's, plus the per-turn KL loss (a method may subclass it through
    ``Extension.actor_class``)."""

    @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
    def use_turn_kl_loss(self, kl_type: str) -> None:
        """Add the per-row-β KL term to this worker's (verl's) actor loss; ``kl_type``: a verl ``kl_penalty`` name."""
        base: Any = self.loss_fn
        if getattr(base, "func", None) is turn_kl_loss:
            return
        self.loss_fn = partial(turn_kl_loss, base=base, kl_type=kl_type)
        self.actor.set_loss_fn(self.loss_fn)
