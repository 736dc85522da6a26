"""A turn in which the server sampled no token is in no loss (issue 34, item 9).

``LevelRows.of`` and ``build_rows`` give it one placeholder token, which verl's padding-free rows need, attended but
with ``response_mask`` 0. Through verl's own PPO loss, with an advantage of 1 on every position, the empty row's
tokens get no gradient while the non-empty row's do. It used to be token id 0 with mask 1: trained as if the model had
sampled token 0.
"""

from __future__ import annotations

from functools import partial

import torch

from agent_system import verl_compat as vc
from agent_system.config import compose_config
from agent_system.levels.policy import to_padding_free
from agent_system.multi_turn_rollout.episode import Attempt, Episode, Turn
from agent_system.prompts.templates import Prompt, Task
from agent_system.trainer.packing import build_rows
from agent_system.trainer.rows import LevelRows

ACTOR = vc.omega_conf_to_dataclass(compose_config([]).actor_rollout_ref.actor)
PAD = 7


def _batch():
    turns = [
        Turn(Prompt("", [1, 2, 3]), [5, 6], [-0.5, -0.7], "ab", False),
        Turn(Prompt("", [1, 2]), [], [], "", False),  # the server sampled no token
    ]
    rows = LevelRows.of("ll", [Episode(0, Task("What is 1 + 2?", "math", "3"), [Attempt(turn) for turn in turns])])
    return build_rows(rows.prompts, rows.responses, PAD, rows.log_probs)


def test_empty_turn_is_one_masked_placeholder():
    batch = _batch()
    assert batch.batch["response_mask"].tolist() == [[1, 1], [0, 0]]
    assert batch.batch["responses"][1].tolist() == [PAD, PAD]  # the placeholder is the pad id, not token 0
    assert batch.batch["attention_mask"][1].tolist() == [0, 1, 1, 1, 0]  # prompt + the placeholder: a valid sequence
    assert batch.batch["rollout_log_probs"][1].tolist() == [0.0, 0.0]


def test_empty_turn_gets_no_gradient_from_verls_loss():
    batch = _batch()
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = -0.6 * torch.ones_like(mask)
    batch.batch["advantages"] = torch.ones_like(mask)  # on every position: only the mask keeps it off the empty row
    td = to_padding_free(batch, temperature=1.0)
    vc.tensordict_utils.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    offsets = td["input_ids"].offsets()
    raw = (-0.6 * torch.ones(int(offsets[-1]))).requires_grad_(True)  # the actor's log-prob of every token
    output = {"log_probs": torch.nested.nested_tensor_from_jagged(raw, offsets)}
    loss, _ = partial(vc.ppo_loss, config=ACTOR)(model_output=output, data=td)
    loss.backward()
    row_of = torch.repeat_interleave(torch.arange(2), offsets.diff())
    assert raw.grad[row_of == 1].abs().max() == 0, raw.grad
    assert raw.grad[row_of == 0].abs().max() > 0, raw.grad
