"""On real verl workers (the LL on two data-parallel ranks): an update from a permuted batch leaves the actor exactly
as the same batch in its original order does (issue 17, item 8). Rows reach the ranks in a balanced, canonical order
(``levels/balance.py``); before, each rank's rows and mini-batches followed the input order, so the two updates
differed (two mini-batches per rank here)."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.integration


def test_permuted_batch_gives_the_same_update(tiny_models, ray_per_test, tmp_path):
    from agent_system.config import compose_config
    from agent_system.levels.placement import build_workers
    from agent_system.trainer.packing import build_rows

    config = compose_config(
        [
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
            "mlmt.ll_gpus=2",
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            "actor_rollout_ref.actor.optim.lr=0.05",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 8 rows on 2 ranks: two mini-batches per rank
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0",
            "data.max_prompt_length=64",
            "data.max_response_length=16",
        ]
    )
    groups, _ = build_workers(config, use_ref={"ll": False, "hl": False})
    ll = groups["ll"]
    ll.init()
    assert ll.world_size == 2
    rng = random.Random(0)
    lengths = [(30, 12), (28, 10), (26, 12), (24, 9), (6, 3), (5, 2), (4, 3), (3, 1)]
    prompts = [[rng.randrange(5, 200) for _ in range(p)] for p, _ in lengths]
    responses = [[rng.randrange(5, 200) for _ in range(r)] for _, r in lengths]

    def batch(order):
        rows = build_rows([prompts[i] for i in order], [responses[i] for i in order], 0)
        old, _ = ll.compute_log_prob(rows)
        rows.batch["old_log_probs"] = old
        advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in order])[:, None]
        rows.batch["advantages"] = advantages * rows.batch["response_mask"]
        return rows

    probe = build_rows(prompts, responses, 0)
    before, _ = ll.compute_log_prob(probe)
    ll.save_checkpoint(str(tmp_path / "start"), 0)
    permuted = list(range(8))
    random.Random(3).shuffle(permuted)
    ll.update_actor(batch(list(range(8))))
    in_order, _ = ll.compute_log_prob(probe)
    ll.load_checkpoint(str(tmp_path / "start"))
    restored, _ = ll.compute_log_prob(probe)
    assert torch.equal(restored, before)
    ll.update_actor(batch(permuted))
    from_permuted, _ = ll.compute_log_prob(probe)
    assert (in_order - before).abs().max().item() > 1e-2, "the update did not move the actor"
    assert (from_permuted - in_order).abs().max().item() < 1e-6
