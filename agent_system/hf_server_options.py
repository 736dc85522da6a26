"""Options of the project's ``hf`` rollout server (``<tree>.rollout.engine_kwargs.hf.*``): their defaults and checks.

The config declares each key with ``null`` ("the server's default", below), so a user sets one on the command line
without Hydra's ``+``. Read without torch, so start-up validation can check them in the driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HFServerOptions:
    max_batch_size: int = 64  # requests generated together in one generate() (its padded batch)
    batch_wait_ms: float = 5.0  # how long a batch waits for more requests to join it
    num_threads: int = 0  # torch threads of the server process; 0: torch's default

    @classmethod
    def from_config(cls, values: Mapping | None, where: str) -> HFServerOptions:
        """The options ``values`` sets (a ``null`` takes the default), or a ``ValueError`` naming ``where.KEY``."""
        values = {key: value for key, value in (values or {}).items() if value is not None}
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{', '.join(f'{where}.{key}' for key in unknown)}: not an option of the hf rollout "
                             f"server (its options: {', '.join(known)})")  # fmt: skip
        for key, value in values.items():
            kind, least = _KINDS[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < least or kind(value) != value:
                whole = "a whole number" if kind is int else "a number"
                raise ValueError(f"{where}.{key}={value!r}: use {whole} >= {least}")
        return cls(**{key: _KINDS[key][0](value) for key, value in values.items()})


# each option's type and least value
_KINDS: dict[str, tuple[type, int]] = {"max_batch_size": (int, 1), "batch_wait_ms": (float, 0), "num_threads": (int, 0)}
