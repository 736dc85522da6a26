"""Row order of a batch sent to a level's data-parallel ranks: balanced token counts, mini-batches that mix turns and
lengths, independent of input order.

verl's worker groups split a batch into equal contiguous chunks, one per rank, and each rank cuts its chunk into
contiguous mini-batches, one optimizer step each (``actor.shuffle=false``, the default). The rows of one MLMT level
come in episode order (a problem's attempts, then its refinements...), so one rank can get all the long rows and the
others wait for it; and the rows a rank gets, its mini-batches, hence the update, depend on that order.

:func:`balanced_order` fixes both, for a level with more than one rank:

1. a **canonical order** of the rows, from their content only (token count, then the row's values in the tensors
   given as keys: tokens, response mask, advantages...), so that any permutation of the same rows gives the same
   order;
2. **equal-size partitions** with balanced token counts: rows taken longest first (in canonical order on ties), each
   to the rank with the fewest tokens among those that still have room (rows per rank = rows / ranks);
3. within each rank, a **seeded stratified shuffle** (:func:`spread_order`) for the ``pieces`` contiguous
   mini-batches verl will cut: the rank's rows grouped by stratum (the row's turn, when given), each group in
   canonical order dealt in runs of ``pieces`` rows, one to each mini-batch, which one drawn from a seeded generator,
   and each mini-batch's rows shuffled; ranks one after the other (verl's contiguous split).

So every optimizer step gets each rank's rows of each turn in proportion (the counts of a turn in two mini-batches of
a rank differ by at most one) and spread over their lengths. In canonical order (before), the rows of a rank went
shortest first, so with a level's turn-1 rows shorter than its turn-3 rows the first optimizer step of an update held
only turn-1 rows and the last only turn-3 rows.

The shuffle permutes canonical positions with a generator seeded by ``seed`` alone (the level's
``actor.data_loader_seed`` / ``critic.data_loader_seed``, verl's "seed used to construct mini-batch"), so the same
rows reach the same rank in the same position whatever their input order, and a permuted batch gives the same update.
verl's own ``shuffle=true`` still acts after this: it reshuffles each rank's rows uniformly (seed
``data_loader_seed`` + rank, a new order every PPO epoch), which keeps the update independent of input order but
replaces the stratified mini-batches by random ones (mixed on average, not row for row). One rank keeps the input
order (episode order: a problem's turn-1 and turn-3 rows side by side). This is verl's ``_balance_batch`` idea
(``RayPPOTrainer``), written for these batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Balance:
    """A row order for ``ranks`` ranks: ``order[i]`` is the input row placed at position ``i``."""

    order: torch.Tensor  # (N,) long: a permutation of range(N)
    rank_tokens: list[int]  # tokens (attention-mask sum) per rank, in rank order

    def inverse(self) -> torch.Tensor:
        """``inverse[j]``: the position of input row ``j`` in the balanced order."""
        inverse = torch.empty_like(self.order)
        inverse[self.order] = torch.arange(len(self.order))
        return inverse

    def metrics(self) -> dict[str, float]:
        """Token counts of the fullest and emptiest rank (verl's ``global_seqlen/max|min`` in spirit)."""
        return {"rank_tokens_max": float(max(self.rank_tokens)), "rank_tokens_min": float(min(self.rank_tokens))}


def canonical_order(lengths: torch.Tensor, keys: list[torch.Tensor]) -> list[int]:
    """Row indices sorted by content: token count, then each row's values in ``keys`` (each (N, ...)).

    Rows equal in every key keep their input order; they are interchangeable, so that does not change what the
    ranks receive.
    """
    columns = [lengths.tolist(), *(key.reshape(len(key), -1).tolist() for key in keys)]
    return sorted(range(len(lengths)), key=lambda i: tuple(column[i] for column in columns))


def balanced_order(
    lengths: torch.Tensor,
    keys: list[torch.Tensor],
    ranks: int,
    pieces: int = 1,
    seed: int = 0,
    strata: torch.Tensor | None = None,
) -> Balance:
    """The order of the rows of a batch for ``ranks`` data-parallel ranks; see the module docstring.

    Args:
        lengths: (N,) tokens per row (the attention-mask sum).
        keys: the row contents that make the order canonical (:func:`canonical_order`).
        ranks: data-parallel ranks; verl gives each the next N / ranks rows.
        pieces: contiguous mini-batches verl cuts each rank's rows into (1: a log-prob or value batch).
        seed: seed of the shuffle within each rank (:func:`spread_order`).
        strata: (N,) a class per row whose classes every mini-batch holds in proportion (the row's turn), or None.

    Raises:
        ValueError: the row count is not a multiple of ``ranks`` (pad the batch first), or a rank's share is not a
            multiple of ``pieces``.
    """
    rows = len(lengths)
    if ranks < 1 or rows % ranks:
        raise ValueError(f"{rows} rows cannot be split evenly over {ranks} data-parallel ranks")
    canonical = canonical_order(lengths, keys)
    position = {row: i for i, row in enumerate(canonical)}
    lengths = lengths.tolist()
    capacity = rows // ranks
    parts: list[list[int]] = [[] for _ in range(ranks)]
    tokens = [0] * ranks
    for row in sorted(canonical, key=lambda r: (-lengths[r], position[r])):
        rank = min((k for k in range(ranks) if len(parts[k]) < capacity), key=lambda k: (tokens[k], k))
        parts[rank].append(row)
        tokens[rank] += lengths[row]
    stratum = strata.tolist() if strata is not None else [0] * rows
    generator = torch.Generator().manual_seed(seed)
    order = []
    for part in parts:
        classes = sorted({stratum[r] for r in part})
        groups = [sorted((r for r in part if stratum[r] == k), key=position.__getitem__) for k in classes]
        order += spread_order(groups, pieces, generator)
    return Balance(order=torch.tensor(order, dtype=torch.long), rank_tokens=tokens)


def spread_order(strata: list[list[int]], pieces: int, generator: torch.Generator) -> list[int]:
    """The rows of ``strata`` (lists of row indices) in an order whose ``pieces`` equal contiguous pieces each hold
    floor(s / pieces) or ceil(s / pieces) rows of every stratum of s rows.

    Each stratum's rows are dealt in runs of ``pieces``, one row to each of the pieces that hold the fewest rows so
    far, which piece gets which row drawn from ``generator``; each piece's rows are then shuffled.

    Raises:
        ValueError: the row count is not a multiple of ``pieces``.
    """
    total = sum(len(stratum) for stratum in strata)
    if pieces < 1 or total % pieces:
        raise ValueError(f"{total} rows of a rank cannot be cut into {pieces} equal mini-batches")
    dealt: list[list[int]] = [[] for _ in range(pieces)]
    for stratum in strata:
        for start in range(0, len(stratum), pieces):
            run = stratum[start : start + pieces]
            draw = torch.randperm(pieces, generator=generator).tolist()
            emptiest = sorted(range(pieces), key=lambda k: (len(dealt[k]), draw[k]))
            for row, piece in zip(run, emptiest, strict=False):
                dealt[piece].append(row)
    return [piece[i] for piece in dealt for i in torch.randperm(len(piece), generator=generator).tolist()]
