"""Row order of a batch sent to a level's data-parallel ranks: balanced token counts, independent of input order.

verl's worker groups split a batch into equal contiguous chunks, one per rank. The rows of one MLMT level come in
episode order (a problem's attempts, then its refinements...), so one rank can get all the long rows and the others
wait for it; and the rows a rank gets, its mini-batches, hence the update, depend on that order.

:func:`balanced_order` fixes both, for a level with more than one rank:

1. a **canonical order** of the rows, from their content only (token count, then the row's values in the tensors
   given as keys: tokens, response mask, advantages...), so that any permutation of the same rows gives the same
   order;
2. **equal-size partitions** with balanced token counts: rows taken longest first (in canonical order on ties), each
   to the rank with the fewest tokens among those that still have room (rows per rank = rows / ranks);
3. the rows of each rank in canonical order, ranks one after the other (verl's contiguous split).

The same rows therefore reach the same rank in the same position whatever their input order, so a permuted batch
gives the same update. This is verl's ``_balance_batch`` idea (``RayPPOTrainer``), written for these batches.
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


def balanced_order(lengths: torch.Tensor, keys: list[torch.Tensor], ranks: int) -> Balance:
    """The order of the rows of a batch for ``ranks`` data-parallel ranks; see the module docstring.

    ``lengths``: (N,) tokens per row (the attention-mask sum); ``keys``: the row contents that make the order
    canonical (:func:`canonical_order`).

    Raises:
        ValueError: the row count is not a multiple of ``ranks`` (pad the batch first).
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
    order = [row for part in parts for row in sorted(part, key=position.__getitem__)]
    return Balance(order=torch.tensor(order, dtype=torch.long), rank_tokens=tokens)
