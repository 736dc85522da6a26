"""A readable console: known library noise is filtered, real warnings and errors still show.

A run starts a dozen processes (Ray workers, vLLM servers and engines) that each import verl, vLLM, transformers and
torch, and each of those prints the same harmless lines: verl's "<engine> engine is not available" (five per
process), vLLM's start-up notes about Triton, LD_PRELOAD and eager mode, transformers' torchvision fallback...
:func:`install` drops exactly those lines (matched by logger and message, never by level), in every process that
imports verl (via the project's verl plugin) or vLLM (via the project's vLLM plugin). Set ``MLMT_SHOW_ALL_LOGS=1``
to see everything.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

# (logger name prefix, message regex): messages known to be harmless on every machine this project targets.
KNOWN_NOISE: tuple[tuple[str, str], ...] = (
    ("vllm", r"libiomp is not found in LD_PRELOAD|libtcmalloc is not found in LD_PRELOAD"),
    ("vllm", r"Triton is installed|Model Runner V2 requires Triton"),
    ("vllm", r"Enforce eager set|Inductor compilation was disabled"),
    ("vllm", r"The global random seed is set to|Reset SSM cache type"),
    ("vllm", r"Passing raw prompts to InputProcessor is deprecated"),
    ("vllm", r"Default vLLM sampling parameters have been overridden"),
    ("transformers", r"requires torchvision \(not installed\)|Ignoring clean_up_tokenization_spaces"),
    ("torch.fx", r"is_fx_tracing will return true"),
    ("verl", r"update_weights done, time cost"),  # every sync; the trainer logs timing_s/sync_<level>
)
# verl warns about every optional training engine it cannot import (torchtitan, veomni, megatron, ...).
KNOWN_WARNINGS: tuple[str, ...] = (r".* engine is not available",)


class KnownNoiseFilter(logging.Filter):
    """Drops records whose logger and message match :data:`KNOWN_NOISE`."""

    def __init__(self) -> None:
        super().__init__()
        self.patterns = [(prefix, re.compile(message)) for prefix, message in KNOWN_NOISE]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(record.name.startswith(prefix) and p.search(message) for prefix, p in self.patterns)


_FILTER = KnownNoiseFilter()


def keep_root_log_level() -> None:
    """Stop vLLM's dependency ``model_hosting_container_standards`` from raising the root logger to ERROR.

    On import it sets the root logger and its handlers to ``SAGEMAKER_CONTAINER_LOG_LEVEL`` (default ERROR), which
    silences every INFO line of this project (checkpoints, resume, the run summary). Call after logging is set up:
    the variable is pinned to the root logger's current level.
    """
    level = logging.getLogger().getEffectiveLevel()
    os.environ.setdefault("SAGEMAKER_CONTAINER_LOG_LEVEL", logging.getLevelName(level))


def install() -> None:
    """Filter the known noise in this process (idempotent)."""
    if os.environ.get("MLMT_SHOW_ALL_LOGS"):
        return
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    try:  # transformers attaches its handler lazily: create it now so that it gets the filter
        from transformers.utils import logging as transformers_logging

        transformers_logging.get_logger("transformers")
    except ImportError:
        pass
    # A logger's own filters do not see its children's records; its handlers, its ancestors' (torch keeps its
    # handler on "torch") and the root's do.
    names = {""}
    for prefix, _ in KNOWN_NOISE:
        parts = prefix.split(".")
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    for name in sorted(names):
        logger = logging.getLogger(name)
        for target in [logger, *logger.handlers]:
            if _FILTER not in target.filters:
                target.addFilter(_FILTER)
