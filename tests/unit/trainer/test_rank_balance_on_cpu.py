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


# ---------------------------------------------------------------- every optimizer step mixes turns (issue 41, item 5)

TURN_ROWS = 24  # alternating turn 1 (an attempt: short) and turn 3 (a refinement, its prompt quotes the feedback: long)
LONGEST_TURN_1 = 18  # tokens of the longest turn-1 row (prompt + response); every turn-3 row has at least 30


def _turn_batch(order: list[int]):
    """The solver's rows as ``build_level_batch`` makes them (``turn`` per row), in the given order of 24 rows."""
    rng = random.Random(2)
    turns = [1 if i % 2 == 0 else 3 for i in range(TURN_ROWS)]
    sizes = [
        (rng.randint(6, 12), rng.randint(2, 6)) if t == 1 else (rng.randint(24, 40), rng.randint(6, 12)) for t in turns
    ]
    prompts = [[rng.randrange(5, 500) for _ in range(p)] for p, _ in sizes]
    responses = [[rng.randrange(5, 500) for _ in range(r)] for _, r in sizes]
    batch = build_rows(
        [prompts[i] for i in order], [responses[i] for i in order], 0, None, {"turn": [turns[i] for i in order]}
    )
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = -mask
    batch.batch["advantages"] = torch.tensor([float(i) - 11.5 for i in order])[:, None] * mask
    batch.batch["values"] = 0.1 * mask
    batch.batch["returns"] = batch.batch["advantages"]
    return batch


def _steps(td, ranks: int, mini_batch: int) -> list[list[list[int]]]:
    """Tokens per row of each optimizer step of each rank: verl's split of the batch over the ranks, then its
    mini-batch iterator over each rank's rows (``shuffle=false``, as the level's workers cut them)."""
    steps = []
    for chunk in vc.tensordict_utils.chunk_tensordict(td, ranks):
        pieces = vc.tensordict_utils.make_iterator(
            chunk, mini_batch_size=mini_batch // ranks, epochs=1, seed=0, dataloader_kwargs={"shuffle": False}
        )
        steps.append([piece["input_ids"].offsets().diff().tolist() for piece in pieces])
    return steps


def _assert_turns_in_proportion(steps: list[list[list[int]]]) -> None:
    """Every mini-batch of a rank holds its rank's turn-1 rows in proportion (within one row) and rows of both turns."""
    for rank in steps:
        share = sum(len(piece) for piece in rank)
        turn_1 = sum(n <= LONGEST_TURN_1 for piece in rank for n in piece)
        for piece in rank:
            count = sum(n <= LONGEST_TURN_1 for n in piece)
            assert abs(count - turn_1 * len(piece) / share) < 1 and 0 < count < len(piece), (rank, steps)


@pytest.mark.parametrize("pieces", [2, 3, 6])
@pytest.mark.parametrize("by_turn", [True, False])  # False: no turn field, length alone spreads the rows
def test_every_mini_batch_of_a_rank_holds_both_turns_in_proportion(pieces, by_turn):
    turns = torch.tensor([1 if i % 2 == 0 else 3 for i in range(TURN_ROWS)])
    lengths = torch.where(turns == 1, torch.arange(TURN_ROWS) % 7 + 10, torch.arange(TURN_ROWS) % 11 + 40)
    ids = torch.arange(TURN_ROWS)[:, None]  # distinct rows
    balance = balanced_order(lengths, [ids], ranks=2, pieces=pieces, seed=0, strata=turns if by_turn else None)
    order = balance.order.tolist()
    assert sorted(order) == list(range(TURN_ROWS))
    half = TURN_ROWS // 2
    for share in (order[:half], order[half:]):
        turn_1 = sum(turns[r] == 1 for r in share)
        for piece in torch.tensor(share).chunk(pieces):
            count = int((turns[piece] == 1).sum())
            assert abs(count - turn_1 / pieces) < 1, (pieces, order)  # canonical order (before): 6 and 0 of 6
    tokens = [int(lengths[order[:half]].sum()), int(lengths[order[half:]].sum())]
    assert tokens == balance.rank_tokens and max(tokens) - min(tokens) <= int(lengths.max()), tokens
    permuted = list(range(TURN_ROWS))
    random.Random(4).shuffle(permuted)  # input row permuted[i] at position i
    again = balanced_order(
        lengths[permuted], [ids[permuted]], ranks=2, pieces=pieces, seed=0, strata=turns[permuted] if by_turn else None
    )
    assert [permuted[i] for i in again.order.tolist()] == order
    other_seed = balanced_order(lengths, [ids], ranks=2, pieces=pieces, seed=1, strata=turns if by_turn else None)
    assert other_seed.order.tolist() != order and other_seed.rank_tokens == balance.rank_tokens


def test_each_optimizer_step_of_an_update_mixes_the_turns():
    group = _group(world_size=2)
    group.config.actor.ppo_mini_batch_size = 8  # 24 rows on 2 ranks: 3 optimizer steps of 4 rows per rank
    group.update_actor(_turn_batch(list(range(TURN_ROWS))))
    steps = _steps(group.worker_group.sent[-1], ranks=2, mini_batch=8)
    assert [len(rank) for rank in steps] == [3, 3]
    _assert_turns_in_proportion(steps)  # canonical order (before): turn-1 rows per step 4, 2, 0 on each rank
    for step in zip(*steps, strict=True):  # one optimizer step: the rows of every rank
        turn_1 = sum(n <= LONGEST_TURN_1 for rows in step for n in rows)
        assert abs(turn_1 - 4) <= 1, steps  # 12 turn-1 rows of 24, 8 rows per step
    permuted = list(range(TURN_ROWS))
    random.Random(5).shuffle(permuted)
    group.update_actor(_turn_batch(permuted))
    first, second = (_content(td) for td in group.worker_group.sent)
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_each_critic_optimizer_step_mixes_the_turns(critic_view):
    critic = _critic(critic_view, world_size=2)  # critic.ppo_mini_batch_size=4: 6 steps of 2 rows per rank
    critic.update(_turn_batch(list(range(TURN_ROWS))))
    steps = _steps(critic.worker_group.sent[-1], ranks=2, mini_batch=4)
    assert [len(rank) for rank in steps] == [6, 6]
    _assert_turns_in_proportion(steps)


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
