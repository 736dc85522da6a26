"""Resumable pieces of the trainer: a seeded problem sampler and atomic checkpoint bookkeeping.

Checkpoint layout under ``<trainer.default_local_dir>/checkpoints``::

    global_step_N/ll/            LL actor (verl FSDP checkpoint: model, optimizer, HF config)
    global_step_N/hl/            HL actor
    global_step_N/ll_snapshot/   the lagged LL snapshot of the contrastive HL reward (its model shards; snapshot.py)
    global_step_N/trainer_state.pt   step, sampler position, stage, RNG states, probe log-probs, the snapshot's
                                     refresh step
    latest_checkpointed_iteration.txt  N, written (tmp + rename) only after everything above is complete

Retention (``trainer.max_actor_ckpt_to_keep``, :func:`prune_checkpoints`): after the pointer names the new checkpoint,
whole ``global_step_N`` folders older than the kept ones are deleted, each first renamed to ``.pruning_global_step_N``
(atomic), so a kill mid-deletion leaves a folder no resume can pick; the next pruning removes it. With
``trainer.keep_best=val/<metric>`` the checkpoint of the best validation step so far (:func:`best_step`, from the
history saved in each ``trainer_state.pt``) is kept as well, and named in ``best_checkpoint.json``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import torch

LATEST = "latest_checkpointed_iteration.txt"
BEST = "best_checkpoint.json"  # trainer.keep_best: {"metric", "step", "value"} of the kept best checkpoint
STEP_PREFIX = "global_step_"
PRUNING_PREFIX = ".pruning_"  # a global_step_N folder being deleted: never a resume candidate


class ProblemSampler:
    """Shuffled, seeded, resumable batches of dataset rows (epoch-wise permutations)."""

    def __init__(self, frame: pd.DataFrame, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if len(frame) < batch_size:
            raise ValueError(f"the dataset has {len(frame)} rows, fewer than data.train_batch_size={batch_size}")
        self.frame, self.batch_size, self.seed, self.shuffle = frame, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.frame))
        return np.random.default_rng(self.seed + self.epoch).permutation(len(self.frame))

    def next_batch(self) -> list[dict]:
        if self.position + self.batch_size > len(self.frame):
            self.epoch, self.position = self.epoch + 1, 0
        rows = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.frame.iloc[int(i)].to_dict() for i in rows]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def latest_step(root: str | os.PathLike) -> int | None:
    """The step of the latest complete checkpoint, or None."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    step = int(pointer.read_text().strip())
    if not (step_dir(root, step) / "trainer_state.pt").is_file():
        raise FileNotFoundError(f"{pointer} names step {step}, but {step_dir(root, step)} is incomplete")
    return step


def checkpoint_steps(root: str | os.PathLike) -> list[int]:
    """The steps of the complete checkpoints under ``root`` (``trainer_state.pt`` written), ascending."""
    steps = [
        int(folder.name.removeprefix(STEP_PREFIX))
        for folder in Path(root).glob(f"{STEP_PREFIX}*")
        if folder.name.removeprefix(STEP_PREFIX).isdigit() and (folder / "trainer_state.pt").is_file()
    ]
    return sorted(steps)


def write_json(path: Path, document: dict) -> None:
    """Write ``document`` to ``path`` atomically (tmp + rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


def write_trainer_state(root: str | os.PathLike, step: int, state: dict) -> None:
    path = step_dir(root, step) / "trainer_state.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def read_trainer_state(root: str | os.PathLike, step: int) -> dict:
    return torch.load(step_dir(root, step) / "trainer_state.pt", weights_only=False)


def mark_latest(root: str | os.PathLike, step: int) -> None:
    """Point ``latest`` at ``step``; called last, so a crash mid-save leaves the previous pointer intact."""
    pointer = Path(root) / LATEST
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(f"{step}\n")
    os.replace(tmp, pointer)


def best_step(history: list[dict], metric: str, steps: set[int]) -> tuple[int, float] | None:
    """The step among ``steps`` whose record in ``history`` (the trainer's per-step metrics) has the highest
    ``metric``, with its value (the earliest on a tie); None when no such step recorded it."""
    scored = [(record[metric], -record["step"]) for record in history if record["step"] in steps and metric in record]
    if not scored:
        return None
    value, negated = max(scored)
    return -negated, float(value)


def prune_checkpoints(root: str | os.PathLike, keep: int | None, protect: int | None = None) -> list[int]:
    """Delete the ``global_step_N`` folders older than the ``keep`` newest complete checkpoints, except the step
    ``protect`` (the best validation step, ``trainer.keep_best``); returns the deleted steps.

    Kept: the step the ``latest`` pointer names, the ``keep - 1`` newest complete checkpoints (``trainer_state.pt``
    written) below it, and ``protect``. Deleted: every other ``global_step_N`` folder with N below the oldest of the
    newest kept, complete or not.
    Folders above the pointer (a save a crash cut short, redone after the resume) are left alone. Call it after
    :func:`mark_latest`: the checkpoint a resume needs is then complete and kept. Each folder is renamed to
    ``.pruning_global_step_N`` before it is deleted, so a kill mid-deletion never leaves a partial ``global_step_N``;
    such leftovers are deleted here first. ``keep`` None: keep every checkpoint.
    """
    root = Path(root)
    for leftover in root.glob(f"{PRUNING_PREFIX}{STEP_PREFIX}*"):
        shutil.rmtree(leftover)
    latest = latest_step(root)
    if keep is None or latest is None:
        return []
    steps = sorted(
        int(folder.name.removeprefix(STEP_PREFIX))
        for folder in root.glob(f"{STEP_PREFIX}*")
        if folder.is_dir() and folder.name.removeprefix(STEP_PREFIX).isdigit()
    )
    complete = [s for s in steps if s < latest and (step_dir(root, s) / "trainer_state.pt").is_file()]
    kept = [*complete[-(keep - 1) :], latest] if keep > 1 else [latest]
    pruned = [s for s in steps if s < min(kept) and s != protect]
    for step in pruned:
        doomed = root / f"{PRUNING_PREFIX}{STEP_PREFIX}{step}"
        os.replace(step_dir(root, step), doomed)
        shutil.rmtree(doomed)
    return pruned


def total_training_steps(total_steps: int | None, total_epochs: int, train_rows: int, batch_size: int) -> int:
    """Steps of the run: ``trainer.total_training_steps``, or when it is null ``trainer.total_epochs`` epochs of
    ``⌊train_rows / batch_size⌋`` steps (the sampler's epoch length)."""
    if total_steps is not None:
        return int(total_steps)
    return int(total_epochs) * (train_rows // batch_size)


def resume_point(mode: str, ckpt_dir: str | os.PathLike, resume_from_path: str | None) -> tuple[Path, int] | None:
    """The checkpoint root and step to resume from, or None to start fresh.

    Args:
        mode: ``trainer.resume_mode``: ``disable``; ``auto`` (the latest complete checkpoint in this run's
            ``ckpt_dir``, if any); ``resume_path`` (the ``global_step_N`` folder ``resume_from_path``, of any run).
        ckpt_dir: this run's checkpoint root.
        resume_from_path: ``trainer.resume_from_path``.
    """
    if mode == "disable":
        return None
    if mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        folder = Path(resume_from_path).expanduser().resolve()
        if not folder.name.startswith(STEP_PREFIX) or not (folder / "trainer_state.pt").is_file():
            raise FileNotFoundError(
                f"trainer.resume_from_path={resume_from_path}: not a complete global_step_N checkpoint folder "
                "(no trainer_state.pt)"
            )
        return folder.parent, int(folder.name.removeprefix(STEP_PREFIX))
    step = latest_step(ckpt_dir)
    return None if step is None else (Path(ckpt_dir), step)
