"""On real verl workers (the LL on two data-parallel ranks):

1. an update from a permuted batch leaves the actor exactly as the same batch in its original order does (issue 17,
   item 8). Rows reach the ranks in a balanced order independent of the input order (``levels/balance.py``); before,
   each rank's rows and mini-batches followed the input order, so the two updates differed;
2. every optimizer step holds rows of both turns in proportion (issue 41, item 5). The rows alternate turn 1 (short)
   and turn 3 (long); each rank gets 2 of each and cuts them into two mini-batches. Before, each rank's rows went in
   canonical order (shortest first) and verl cuts without shuffling (``actor.shuffle=false``), so each rank's first
   optimizer step held its two turn-1 rows and its second its two turn-3 rows.

What each optimizer step got is read inside the workers: the recording worker (a subclass of the project's
``ActorWorker``) wraps its own verl ``TrainingWorker.train_batch``, which runs one optimizer step per call, and keeps
the token count of each row it was given.
"""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.integration

# (prompt, response) tokens, alternating turn 1 (short: at most 9 tokens) and turn 3 (long: at least 33)
LENGTHS = [(6, 3), (30, 12), (5, 2), (28, 10), (4, 3), (26, 12), (3, 1), (24, 9)]
TURNS = [1, 3] * 4
LONGEST_TURN_1 = 9


def _recording_worker():
    """The project's actor worker, recording the rows of each optimizer step (defined in a function so that Ray
    ships the class itself, not a reference to this test module, which its workers cannot import)."""
    from agent_system import verl_compat as vc
    from agent_system.levels.turn_kl import ActorWorker

    class RecordingWorker(ActorWorker):
        @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
        def record_optimizer_steps(self) -> None:
            self.optimizer_steps, train_batch = [], self.actor.train_batch

            def recorded(data):
                self.optimizer_steps.append(data["input_ids"].offsets().diff().tolist())
                return train_batch(data)

            self.actor.train_batch = recorded

        @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
        def recorded_optimizer_steps(self) -> list[list[int]]:
            return self.optimizer_steps

    return RecordingWorker


def test_permuted_batch_gives_the_same_update_and_every_step_mixes_the_turns(tiny_models, ray_per_test, tmp_path):
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
    groups, _ = build_workers(config, use_ref={"ll": False, "hl": False}, actor_classes={"ll": _recording_worker()})
    ll = groups["ll"]
    ll.init()
    assert ll.world_size == 2
    ll.worker_group.record_optimizer_steps()
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 200) for _ in range(p)] for p, _ in LENGTHS]
    responses = [[rng.randrange(5, 200) for _ in range(r)] for _, r in LENGTHS]

    def batch(order):
        turns = {"turn": [TURNS[i] for i in order]}  # as build_level_batch sends them
        rows = build_rows([prompts[i] for i in order], [responses[i] for i in order], 0, None, turns)
        old, _ = ll.compute_log_prob(rows)
        rows.batch["old_log_probs"] = old
        advantages = torch.tensor([1.0 if i % 4 < 2 else -1.0 for i in order])[:, None]
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

    steps = ll.worker_group.recorded_optimizer_steps()  # per rank: the rows' tokens of each step, both updates
    assert [len(rank) for rank in steps] == [4, 4], steps
    for rank in steps:
        turn_1 = [sum(n <= LONGEST_TURN_1 for n in step) for step in rank]
        assert turn_1 == [1, 1, 1, 1], steps  # before: [2, 0, 2, 0]
        assert rank[:2] == rank[2:], steps  # the permuted batch: the same rows in the same steps
