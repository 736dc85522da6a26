"""Rows sent to a level's data-parallel ranks are balanced by length and their order no longer depends on the input
order (issue 17, item 8; verl's ``_balance_batch`` idea), the critics' as the actors' (issue 33, item 6).

The unit tier cannot start Ray: each level is a real :class:`PolicyGroup` whose worker group records what verl's
dispatch would hand each rank (equal contiguous chunks of the batch, as ``chunk_tensordict`` splits it). The
batches go through the real conversion to verl's padding-free ``TensorDict``.
"""

from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from agent_system import verl_compat as vc
from agent_system.config import compose_config
from agent_system.levels.balance import balanced_order
from agent_system.levels.critic import CriticGroup
from agent_system.levels.policy import PolicyGroup
from agent_system.trainer.packing import build_rows

# One long problem's rows first, then short ones: the episode order puts all the long rows on rank 0.
PROMPT_LENGTHS = [30, 30, 28, 28, 6, 6, 5, 4]
RESPONSE_LENGTHS = [12, 11, 12, 10, 3, 2, 3, 1]


class _RecordingWorkers:
    """verl's worker group as the driver sees it: ``world_size`` ranks; records every batch it is sent."""

    def __init__(self, world_size: int) -> None:
        self.world_size, self.sent = world_size, []

    def update_actor(self, td):
        self.sent.append(td)
        output = TensorDict({}, batch_size=[])
        vc.tensordict_utils.assign_non_tensor(output, metrics={"actor/pg_loss": 0.0})
        return output

    def compute_log_prob(self, td):
        """A stand-in model whose "log-prob" at each position is a function of the token there."""
        self.sent.append(td)
        values = td["input_ids"].values().float() / 1000.0
        nested = torch.nested.nested_tensor_from_jagged(values, offsets=td["input_ids"].offsets())
        return TensorDict({"log_probs": nested, "entropy": nested}, batch_size=[len(td)])


def _group(world_size: int) -> PolicyGroup:
    view = OmegaConf.create(
        {
            "mlmt": {"placement": "split", "ll": {"freeze": False}, "stages": {"kl_in": "advantage"}},
            "actor_rollout_ref": {
                "rollout": {"temperature": 1.0, "free_cache_engine": False},
                "actor": {
                    "ppo_mini_batch_size": 4,
                    "ppo_epochs": 1,
                    "data_loader_seed": 1,
                    "shuffle": False,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                },
            },
        }
    )
    return PolicyGroup("ll", view, _RecordingWorkers(world_size), use_ref=False)


def _batch(order: list[int]):
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 500) for _ in range(n)] for n in PROMPT_LENGTHS]
    responses = [[rng.randrange(5, 500) for _ in range(n)] for n in RESPONSE_LENGTHS]
    batch = build_rows([prompts[i] for i in order], [responses[i] for i in order], 0)
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = -mask
    advantages = torch.tensor([float(i) - 3.5 for i in order])  # a distinct advantage per row
    batch.batch["advantages"] = advantages[:, None] * mask
    return batch


def _rank_tokens(td, ranks: int) -> list[int]:
    chunks = vc.tensordict_utils.chunk_tensordict(td, ranks)  # verl's split of a batch over its ranks
    return [int(chunk["input_ids"].offsets()[-1]) for chunk in chunks]


def _content(td) -> dict[str, torch.Tensor]:
    return {k: (v.values() if v.is_nested else v) for k, v in td.items() if isinstance(v, torch.Tensor)}


def test_balanced_order_evens_the_ranks_token_counts():
    lengths = torch.tensor([50, 48, 45, 40, 10, 8, 5, 2])
    balance = balanced_order(lengths, [lengths], ranks=2)
    assert sorted(balance.order.tolist()) == list(range(8))
    halves = [int(lengths[balance.order[:4]].sum()), int(lengths[balance.order[4:]].sum())]
    assert halves == balance.rank_tokens and max(halves) - min(halves) <= 2, halves  # contiguous: 183 vs 25
    with pytest.raises(ValueError, match="7 rows cannot be split evenly over 2"):
        balanced_order(lengths[:7], [lengths[:7]], ranks=2)


def test_update_batch_is_balanced_over_two_ranks():
    group = _group(world_size=2)
    metrics = group.update_actor(_batch(list(range(8))))
    tokens = _rank_tokens(group.worker_group.sent[-1], 2)
    longest = max(p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True))
    assert max(tokens) - min(tokens) <= longest, tokens  # episode order: 163 vs 30
    assert metrics["rank_tokens_max"] == max(tokens) and metrics["rank_tokens_min"] == min(tokens)


@pytest.mark.parametrize("rows", [8, 7])  # 7: padded to 8 with a masked copy
def test_a_permuted_batch_sends_the_ranks_the_same_update(rows):
    group = _group(world_size=2)
    order = list(range(rows))
    permuted = order.copy()  # a different order of the same rows
    random.Random(1).shuffle(permuted)
    assert permuted != order
    group.update_actor(_batch(order))
    group.update_actor(_batch(permuted))
    first, second = (_content(td) for td in group.worker_group.sent)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_log_probs_come_back_in_the_callers_row_order():
    order = [5, 0, 7, 2, 1, 6, 3]  # 7 rows: padded for two ranks
    one, two = _group(world_size=1), _group(world_size=2)
    log_probs_one, _ = one.compute_log_prob(_batch(order))
    log_probs_two, _ = two.compute_log_prob(_batch(order))
    assert log_probs_two.shape == log_probs_one.shape == (7, max(RESPONSE_LENGTHS))
    assert torch.equal(log_probs_one, log_probs_two)
    assert _rank_tokens(two.worker_group.sent[-1], 2) != _rank_tokens(one.worker_group.sent[-1], 1)


def test_one_rank_keeps_the_input_order():
    group = _group(world_size=1)
    group.update_actor(_batch([3, 1, 2, 0]))
    sent = group.worker_group.sent[-1]["input_ids"].offsets().diff().tolist()
    assert sent == [PROMPT_LENGTHS[i] + RESPONSE_LENGTHS[i] for i in (3, 1, 2, 0)]


# ---------------------------------------------------------------- the critic's batches (issue 33, item 6)


class _RecordingCriticWorkers:
    """verl's critic ``TrainingWorker`` group as the driver sees it; records every batch it is sent."""

    def __init__(self, world_size: int) -> None:
        self.world_size, self.sent = world_size, []

    def train_mini_batch(self, td):
        self.sent.append(td)
        output = TensorDict({}, batch_size=[])
        vc.tensordict_utils.assign_non_tensor(output, metrics={"critic/vf_loss": 0.0})
        return _Ready(output)

    def infer_batch(self, td):
        """A stand-in value model whose value at each position is a function of the token there."""
        self.sent.append(td)
        values = td["input_ids"].values().float() / 1000.0
        nested = torch.nested.nested_tensor_from_jagged(values, offsets=td["input_ids"].offsets())
        return _Ready(TensorDict({"values": nested}, batch_size=[len(td)]))


class _Ready:
    """What a worker group's non-blocking call returns: ``.get()`` gives the output."""

    def __init__(self, value) -> None:
        self.value = value

    def get(self):
        return self.value


@pytest.fixture(scope="module")
def critic_view(tiny_models):
    return compose_config(
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            "mlmt.ll.adv_estimator=gae",
            "critic.ppo_mini_batch_size=4",
        ]
    )


def _critic(view, world_size: int) -> CriticGroup:
    return CriticGroup("ll", view, _RecordingCriticWorkers(world_size))


def _critic_batch(order: list[int]):
    batch = _batch(order)
    mask = batch.batch["response_mask"].float()
    batch.batch["values"] = 0.1 * mask
    batch.batch["returns"] = batch.batch["advantages"]
    return batch


def test_critic_update_batch_is_balanced_over_two_ranks(critic_view):
    critic = _critic(critic_view, world_size=2)
    metrics = critic.update(_critic_batch(list(range(8))))
    tokens = _rank_tokens(critic.worker_group.sent[-1], 2)
    longest = max(p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True))
    assert max(tokens) - min(tokens) <= longest, tokens  # episode order: 163 vs 30
    assert metrics["critic/rank_tokens_max"] == max(tokens) and metrics["critic/rank_tokens_min"] == min(tokens)
    assert metrics["critic/vf_loss"] == 0.0


def test_a_permuted_batch_sends_the_critics_ranks_the_same_update(critic_view):
    critic = _critic(critic_view, world_size=2)
    order = list(range(7))  # padded to 8 with a masked copy
    permuted = order.copy()
    random.Random(1).shuffle(permuted)
    critic.update(_critic_batch(order))
    critic.update(_critic_batch(permuted))
    first, second = (_content(td) for td in critic.worker_group.sent)
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_values_come_back_in_the_callers_row_order(critic_view):
    order = [0, 1, 2, 3, 5, 6, 7]  # episode order, the long rows first; padded for two ranks
    one, two = _critic(critic_view, world_size=1), _critic(critic_view, world_size=2)
    values_one, values_two = one.compute_values(_critic_batch(order)), two.compute_values(_critic_batch(order))
    assert values_two.shape == values_one.shape == (7, max(RESPONSE_LENGTHS))
    assert torch.equal(values_one, values_two)
    tokens = _rank_tokens(two.worker_group.sent[-1], 2)
    longest = max(p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True))
    assert max(tokens) - min(tokens) <= longest, tokens  # the input order: 161 vs 63
