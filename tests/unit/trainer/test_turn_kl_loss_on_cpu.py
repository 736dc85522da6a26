"""The per-turn KL loss (agent_system/levels/turn_kl.py, ``mlmt.stages.kl_in=loss``) on a real padding-free
``TensorDict`` built the way the trainer builds it, wrapped around verl's own ``ppo_loss``:

* β = 0 on every row is exactly verl's loss (value and gradient);
* the KL part of the gradient is linear in β, and a row whose β is 0 gets none of it;
* it pulls toward the reference: on tokens the actor makes likelier than the reference, descending the KL part
  lowers their log-prob (and raises it where the actor is below the reference).
"""

from functools import partial

import torch

from agent_system import verl_compat as vc
from agent_system.config import compose_config
from agent_system.levels.policy import to_padding_free
from agent_system.levels.turn_kl import LOSS_METRIC, TURN_KL_COEF, turn_kl_loss
from agent_system.trainer.packing import build_rows

ACTOR = vc.omega_conf_to_dataclass(compose_config([]).actor_rollout_ref.actor)
PROMPTS = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2], [1, 2, 7, 8]]
RESPONSES = [[5, 6], [7], [8, 9, 10], [11, 12]]


def _inputs(betas: list[float]):
    """A TensorDict of four rows (old/ref log-probs, advantages, β per row) and the actor's raw token log-probs."""
    batch = build_rows(PROMPTS, RESPONSES, pad_token_id=0)
    mask = batch.batch["response_mask"].float()
    generator = torch.Generator().manual_seed(0)
    batch.batch["old_log_probs"] = -torch.rand(mask.shape, generator=generator) * mask
    batch.batch["ref_log_prob"] = -2.0 * torch.rand(mask.shape, generator=generator) * mask
    batch.batch["advantages"] = torch.tensor([[0.5], [-0.5], [1.0], [-1.0]]) * mask
    batch.batch[TURN_KL_COEF] = torch.tensor(betas)
    td = to_padding_free(batch, temperature=1.0)
    vc.tensordict_utils.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    offsets = td["input_ids"].offsets()
    raw = -torch.rand(int(offsets[-1]), generator=generator)  # the actor's log-prob of every token of every row
    return td, raw.requires_grad_(True), offsets


def _loss_and_grad(betas: list[float], kl_type: str = "low_var_kl", verl_only: bool = False):
    td, raw, offsets = _inputs(betas)
    output = {"log_probs": torch.nested.nested_tensor_from_jagged(raw, offsets)}
    base = partial(vc.ppo_loss, config=ACTOR)
    loss_fn = base if verl_only else partial(turn_kl_loss, base=base, kl_type=kl_type)
    loss, metrics = loss_fn(model_output=output, data=td)
    loss.backward()
    return loss.detach(), metrics, raw.grad.clone(), td, offsets


def test_zero_beta_is_exactly_verls_loss():
    loss, metrics, grad, _, _ = _loss_and_grad([0.0] * 4)
    verl_loss, _, verl_grad, _, _ = _loss_and_grad([0.0] * 4, verl_only=True)
    torch.testing.assert_close(loss, verl_loss)
    torch.testing.assert_close(grad, verl_grad)
    assert metrics[LOSS_METRIC].aggregate() == 0.0


def test_kl_gradient_is_linear_in_beta_and_only_on_rows_with_beta():
    _, _, base, _, offsets = _loss_and_grad([0.0] * 4)
    _, _, one, _, _ = _loss_and_grad([0.0, 0.1, 0.0, 0.3])
    _, _, two, _, _ = _loss_and_grad([0.0, 0.2, 0.0, 0.6])
    torch.testing.assert_close(two - base, 2 * (one - base))
    part = one - base
    row_of = torch.repeat_interleave(torch.arange(4), offsets.diff())
    assert part[(row_of == 0) | (row_of == 2)].abs().max() == 0  # β = 0 rows: verl's gradient only
    assert part[row_of == 1].abs().max() > 0 and part[row_of == 3].abs().max() > 0


def _padded(values: torch.Tensor, td, offsets) -> torch.Tensor:
    """Response positions (B, R) of per-token values over the whole sequences, as verl's loss reads them."""
    return vc.no_padding_2_padding(torch.nested.nested_tensor_from_jagged(values, offsets), td)


def test_descending_the_kl_part_moves_response_log_probs_toward_the_reference():
    for kl_type in ("low_var_kl", "mse"):
        _, _, base, td, offsets = _loss_and_grad([0.0] * 4, kl_type)
        _, _, pulled, _, _ = _loss_and_grad([1.0] * 4, kl_type)
        _, raw, _ = _inputs([1.0] * 4)
        part = pulled - base
        assert (part != 0).sum() == sum(len(r) for r in RESPONSES)  # every response token, no prompt token
        mask = td.select("response_mask").to_padded_tensor()["response_mask"].bool()
        ref = td.select("ref_log_prob").to_padded_tensor()["ref_log_prob"][mask]
        above = _padded(raw.detach(), td, offsets)[mask] > ref  # the actor is likelier than the reference here
        grad = _padded(part, td, offsets)[mask]
        assert above.any() and (~above).any()
        assert (grad[above] > 0).all() and (grad[~above] < 0).all(), kl_type  # a step along −grad: toward ref
