"""Which of verl's KL estimators act as a loss, and the start-up refusal of those that do not (issue 34, item 1).

A KL loss is ``E_{y~π}[k(log π(y), log π_ref(y))]`` over the policy's own samples (sampling is not differentiated).
Over a 5-token vocabulary the expectation is exact, ``Σ_y π(y).detach() · ∇k(y)``, and is checked against gradients
computed independently by autograd of the closed forms:

* k1 (``kl`` / ``k1``: log π − log π_ref) gives ``Σ π ∇log π = ∇Σ π = 0``: it never pulls toward the reference;
* k2 (``mse``) and every ``+`` estimator (verl's straight-through k2 gradient) give ``∇KL(π‖π_ref)``;
* k3 (``low_var_kl``, verl's default) gives ``(1 − π_ref/π)∇log π``, in expectation ``∇KL(π_ref‖π)``: it does pull
  toward the reference (zero only at π = π_ref), but by the other KL direction, and verl clamps its value at 10, so a
  token made more than 13.6× less likely than under the reference gets no gradient at all.
"""

from __future__ import annotations

import math

import pytest
import torch
from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature

from agent_system import verl_compat as vc
from agent_system.config import INERT_KL_LOSS_TYPES, ConfigError, compose_config
from agent_system.launcher.main import check_config

# every name verl 0.9.1's kl_penalty accepts ("full" raises NotImplementedError)
VERL_KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "k3+", "low_var_kl+")
EXACT_KL_GRADIENT = ("mse", "k2", "kl+", "k1+", "k3+", "low_var_kl+")  # the gradient of KL(π‖π_ref) itself
K3 = ("low_var_kl", "k3")

LOGITS = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.2])  # the policy over 5 tokens
REF_LOGITS = torch.tensor([0.2, 0.4, -0.3, 1.1, 0.0])  # its reference


def _expected_gradient(kl_type: str) -> torch.Tensor:
    """∇_logits of the KL loss's expectation over on-policy samples, with verl's ``kl_penalty`` as the loss."""
    logits = LOGITS.clone().requires_grad_(True)
    log_pi, log_ref = torch.log_softmax(logits, -1), torch.log_softmax(REF_LOGITS, -1)
    loss = (log_pi.exp().detach() * vc.kl_penalty(logprob=log_pi, ref_logprob=log_ref, kl_penalty=kl_type)).sum()
    (grad,) = torch.autograd.grad(loss, logits)
    return grad


def _kl_gradient(reverse: bool) -> torch.Tensor:
    """∇_logits of the exact KL(π‖π_ref) (``reverse``: KL(π_ref‖π)), both distributions differentiated as written."""
    logits = LOGITS.clone().requires_grad_(True)
    log_pi, log_ref = torch.log_softmax(logits, -1), torch.log_softmax(REF_LOGITS, -1)
    kl = (log_ref.exp() * (log_ref - log_pi)).sum() if reverse else (log_pi.exp() * (log_pi - log_ref)).sum()
    (grad,) = torch.autograd.grad(kl, logits)
    return grad


def test_k1_as_a_loss_has_zero_expected_gradient():
    forward = _kl_gradient(reverse=False)
    assert forward.abs().max() > 0.1  # the policy is far enough from its reference for a KL loss to act
    for kl_type in INERT_KL_LOSS_TYPES:
        torch.testing.assert_close(_expected_gradient(kl_type), torch.zeros(5), atol=1e-7, rtol=0)


@pytest.mark.parametrize("kl_type", EXACT_KL_GRADIENT)
def test_k2_and_the_straight_through_estimators_give_the_kl_gradient(kl_type):
    torch.testing.assert_close(_expected_gradient(kl_type), _kl_gradient(reverse=False))


@pytest.mark.parametrize("kl_type", K3)
def test_k3_gives_the_gradient_of_the_other_kl_direction(kl_type):
    grad = _expected_gradient(kl_type)
    torch.testing.assert_close(grad, _kl_gradient(reverse=True))
    assert grad.abs().max() > 0.1 and not torch.allclose(grad, _kl_gradient(reverse=False), atol=1e-3)


def test_every_estimator_but_k1_acts():
    """The refusal's list is exactly the estimators whose loss cannot move the policy."""
    inert = [kl_type for kl_type in VERL_KL_TYPES if _expected_gradient(kl_type).abs().max() < 1e-6]
    assert inert == list(INERT_KL_LOSS_TYPES)


def test_k3_clamp_drops_the_gradient_of_tokens_far_below_the_reference():
    """verl: ``kld = clamp(r − log r − 1, max=10)``, r = π_ref/π; the clamp is reached at r = 13.61."""
    threshold = 13.610868638149876
    assert threshold - math.log(threshold) - 1 == pytest.approx(10.0)
    for ratio, k3_acts in ((13.0, True), (14.0, False)):
        log_pi = torch.tensor([-3.0], requires_grad=True)
        log_ref = log_pi.detach() + math.log(ratio)
        for kl_type in ("low_var_kl", "k3+"):
            (grad,) = torch.autograd.grad(vc.kl_penalty(log_pi, log_ref, kl_type).sum(), log_pi)
            acts = kl_type == "k3+" or k3_acts
            assert (grad.item() < 0) == acts and (grad.item() == 0) != acts, (ratio, kl_type, grad)  # < 0: raise π


REFUSED_KL = [
    (["hl.actor.use_kl_loss=true", "hl.actor.kl_loss_type=kl"], ["hl.actor.kl_loss_type=kl", "hl.actor.use_kl_loss"]),
    (["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k1"],
     ["actor_rollout_ref.actor.kl_loss_type=k1", "actor_rollout_ref.actor.use_kl_loss"]),
    (["mlmt.stages.beta_turn3=[0.01]", "actor_rollout_ref.actor.kl_loss_type=kl"],
     ["actor_rollout_ref.actor.kl_loss_type=kl", "mlmt.stages.beta_turn3"]),
    (["mlmt.stages.beta_turn2=[0.1]", "hl.actor.kl_loss_type=k1"],
     ["hl.actor.kl_loss_type=k1", "mlmt.stages.beta_turn2"]),
]  # fmt: skip
ACCEPTED_KL = [
    ["hl.actor.use_kl_loss=true", "hl.actor.kl_loss_type=low_var_kl"],
    ["hl.actor.use_kl_loss=true", "hl.actor.kl_loss_type=k3+"],
    ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k1+"],
    ["hl.actor.kl_loss_type=kl"],  # no KL loss reads it
    ["mlmt.stages.beta_turn3=[0.01]", "mlmt.stages.kl_in=advantage", "actor_rollout_ref.actor.kl_loss_type=kl"],
]


@pytest.mark.parametrize(("overrides", "keys"), REFUSED_KL)
def test_k1_feeding_a_loss_is_refused_naming_the_keys(overrides, keys):
    with pytest.raises(ConfigError) as error:
        check_config(compose_config(overrides))
    for key in [*keys, "low_var_kl", "k3+"]:
        assert key in str(error.value), (key, str(error.value))


@pytest.mark.parametrize("overrides", ACCEPTED_KL)
def test_kl_estimator_that_acts_or_is_not_read_is_accepted(overrides):
    check_config(compose_config(overrides))


def test_temperature_zero_gives_the_sampled_token_no_gradient():
    """Why a trained level may not sample at T = 0: verl scales the logits by 1 / max(T, 1e-8) before the log-probs,
    so the greedy token's log-prob is 0 and its gradient (every loss term's) is 0; at T = 1 it is not."""
    for temperature, acts in ((0.0, False), (1.0, True)):
        logits = LOGITS.clone().requires_grad_(True)
        scaled = _scale_logits_by_temperature(logits, torch.tensor(temperature), is_unit_temperature=False)
        log_prob = torch.log_softmax(scaled, -1)[int(LOGITS.argmax())]
        (grad,) = torch.autograd.grad(log_prob, logits)
        assert (grad.abs().max() > 0.01) == acts, (temperature, log_prob, grad)
