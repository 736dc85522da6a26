"""Fresh copies of a composed config for tests that each edit their own."""

from __future__ import annotations

import pickle
from collections.abc import Callable

from omegaconf import DictConfig


def copier(config: DictConfig) -> Callable[[], DictConfig]:
    """A function returning a fresh copy of ``config`` as it is now: one pickle, then an unpickle per copy (6 ms, where
    ``copy.deepcopy`` of the trainer's config takes 28; about 300 copies in the unit tier)."""
    pickled = pickle.dumps(config)
    return lambda: pickle.loads(pickled)
