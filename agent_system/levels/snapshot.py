"""The lagged LL snapshot: the reference solver of the contrastive HL reward (docs/METHOD.md, "Turns and rewards").

The original's ``reg`` regulariser: a second copy of the solver, refreshed from the LL's weights every ``reg_gap``
steps, regenerates turn 3 from the **same** prompt (x, z, g) as the current LL. Its score R_ref therefore varies with
the feedback g, and the HL score S2 = (1 + λ)·R3 − λ·R_ref rewards feedback that helps the *current* solver more than
a stale one (a per-feedback R_ref, unlike the no-feedback refinement, does not cancel inside an HL group).

The snapshot is its own :class:`~agent_system.levels.policy.PolicyGroup` (verl's ``ActorRolloutRefWorker`` with
role ``actor_rollout``, on its own resource pool of ``mlmt.ll_gpus`` processes, its replicas ranked after the HL's)
that only generates: it is never updated. The original shared the LL's GPUs (``max_colocate_count=2``); here it
needs ``mlmt.ll_gpus`` devices of its own. It starts from the LL's initial weights.

Refresh (after the LL's update of every ``reg_gap``-th step K): the LL saves its checkpoint into a staging folder
``<trainer.default_local_dir>/reg_ref_checkpoint/.tmp_step_K``, which is renamed to ``step_K`` once complete (older
refresh folders are then deleted); the snapshot's actor loads it (model weights only) and its rollout servers, which
never sleep (its devices hold nothing that trains), receive it at the next wake-up (``weight_sync.py``). A crash
mid-refresh leaves only a staging folder, which is never loaded and is removed by the next refresh.

Checkpoints: every ``global_step_N`` holds the snapshot as it is at step N (``global_step_N/ll_snapshot/``, its
model shards) and ``trainer_state.pt`` holds the step of the refresh it came from and the LL's probe log-probs at
that refresh. A resume (``auto`` or ``resume_path``, whichever run's folder it reads) loads the snapshot from that
``global_step_N``, never from a refresh folder: the resumed snapshot scores a probe exactly as the uninterrupted
run's did at step N (``resume/ll_snapshot_logprob_max_abs_diff`` = 0). A checkpoint without a snapshot (a run
without the contrastive reward) gives the snapshot the resumed LL's weights, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from agent_system import verl_compat as vc
from agent_system.config import level_nodes
from agent_system.levels.policy import PolicyGroup
from agent_system.multi_turn_rollout.episode import Episode, Turn, turn_from_output
from agent_system.multi_turn_rollout.stopping import stop_tokens
from agent_system.prompts.templates import Prompt

logger = logging.getLogger(__name__)

SNAPSHOT = "ll_snapshot"
CHECKPOINT_FOLDER = SNAPSHOT  # global_step_N/ll_snapshot: the snapshot's model shards at step N
REFRESH_FOLDER = "reg_ref_checkpoint"


def snapshot_view(config: DictConfig) -> DictConfig:
    """The LL's view of the config with the snapshot's own rollout-server tag and replica ranks.

    verl names rollout servers and weight-transfer sockets by replica rank; the LL's and HL's replicas take the
    first ranks (``placement.assign_replica_ranks``), the snapshot's come after the HL's.
    """
    hl_rollout = config.hl.rollout
    hl_ranks = (
        config.mlmt.hl_gpus
        if config.mlmt.placement == "split"
        else config.trainer.n_gpus_per_node * config.trainer.nnodes
    )
    per_replica = (
        hl_rollout.tensor_model_parallel_size * hl_rollout.data_parallel_size * hl_rollout.pipeline_model_parallel_size
    )
    hl_offset = int((hl_rollout.get("custom") or {}).get("replica_rank_offset", 0) or 0)
    view = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(view):
        view.actor_rollout_ref.rollout.custom = {**(view.actor_rollout_ref.rollout.get("custom") or {})}
        view.actor_rollout_ref.rollout.custom.server_tag = SNAPSHOT
        view.actor_rollout_ref.rollout.custom.replica_rank_offset = hl_offset + max(hl_ranks // per_replica, 1)
        # never updated: only its weights are loaded (from the LL's refresh checkpoint) and saved (with checkpoints)
        view.actor_rollout_ref.actor.checkpoint.save_contents = ["model"]
        view.actor_rollout_ref.actor.checkpoint.load_contents = ["model"]
    return view


def refresh_dir(root: str | os.PathLike, step: int) -> Path:
    """The complete LL checkpoint of the refresh at ``step`` (``<root>/reg_ref_checkpoint/step_K``)."""
    return Path(root) / REFRESH_FOLDER / f"step_{step}"


def staging_dir(root: str | os.PathLike, step: int) -> Path:
    """Where the LL writes the checkpoint of the refresh at ``step`` before it is complete."""
    return Path(root) / REFRESH_FOLDER / f".tmp_step_{step}"


def begin_refresh(root: str | os.PathLike, step: int) -> Path:
    """An empty staging folder for the refresh at ``step``; staging folders a crash left behind are removed."""
    base = Path(root) / REFRESH_FOLDER
    for leftover in base.glob(".tmp_step_*"):
        shutil.rmtree(leftover)
    staging = staging_dir(root, step)
    staging.mkdir(parents=True)
    return staging


def commit_refresh(root: str | os.PathLike, step: int) -> Path:
    """Rename the complete staging folder of ``step`` to ``step_K`` and delete the older refreshes; returns it."""
    staging, final = staging_dir(root, step), refresh_dir(root, step)
    if not staging.is_dir() or not any(staging.iterdir()):
        raise FileNotFoundError(f"{staging}: the LL's refresh checkpoint was not written")
    if final.exists():  # the same step refreshed again (a resumed run repeating it)
        shutil.rmtree(final)
    os.replace(staging, final)
    for older in (Path(root) / REFRESH_FOLDER).glob("step_*"):
        if older != final:
            shutil.rmtree(older)
    return final


def restore_source(checkpoint: str | os.PathLike, step: int, saved: dict) -> tuple[Path | None, int, object]:
    """What a resume from ``checkpoint`` (a ``global_step_N`` folder of any run) loads into the snapshot.

    Args:
        checkpoint: the ``global_step_N`` folder the resume reads.
        step: N.
        saved: that checkpoint's trainer state (``trainer_state.pt``).

    Returns:
        (folder to load or None to keep the initial weights, the refresh step the weights stand for, the LL's probe
        log-probs at that refresh or None when unknown).

    Raises:
        FileNotFoundError: the trainer state names a snapshot but ``checkpoint/ll_snapshot`` is missing.
    """
    folder, info = Path(checkpoint), saved.get("snapshot")
    if info is not None:
        if not (folder / CHECKPOINT_FOLDER).is_dir():
            raise FileNotFoundError(
                f"{folder}: trainer_state.pt records an LL snapshot but {CHECKPOINT_FOLDER}/ is missing"
            )
        return folder / CHECKPOINT_FOLDER, int(info["refreshed_at"]), info["refresh_probe"]
    if (folder / "ll").is_dir():
        logger.warning("%s has no LL snapshot: the snapshot starts from the resumed LL (step %d)", folder, step)
        return folder / "ll", step, None
    logger.warning("%s has neither an LL snapshot nor an LL checkpoint: the snapshot keeps the initial weights", folder)
    return None, 0, None


class LaggedSnapshot:
    """A generate-only copy of the LL, refreshed from the LL every ``mlmt.reward.reg_gap`` steps."""

    def __init__(self, config: DictConfig) -> None:
        view = snapshot_view(config)
        pool = vc.RayResourcePool(
            process_on_nodes=level_nodes(config, "ll"),  # shaped like the LL's pool (one node, or whole nodes)
            use_gpu=True,
            max_colocate_count=1,
            name_prefix=f"mlmt_{SNAPSHOT}",
        )
        worker_group = vc.RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=PolicyGroup.worker_class(view, use_ref=False),
            name_prefix=f"mlmt_{SNAPSHOT}",
            device_name=vc.get_device_name(),
        )
        self.group = PolicyGroup(SNAPSHOT, view, worker_group, use_ref=False)
        self.reg_gap = int(config.mlmt.reward.reg_gap)
        self.root = Path(config.trainer.default_local_dir)
        self.refreshed_at = 0  # the step whose LL weights the snapshot holds (0: the initial weights)
        self.refresh_probe: torch.Tensor | None = None  # the LL's probe log-probs at that refresh

    def init(self) -> None:
        """Start the snapshot's actor (the LL's initial weights) and its rollout servers."""
        self.group.init()

    def due(self, step: int) -> bool:
        """A refresh is due after the LL's update at every ``reg_gap``-th step."""
        return step % self.reg_gap == 0

    def refresh(self, ll: PolicyGroup, step: int, probe) -> dict[str, float]:
        """Copy the LL's current weights into the snapshot (through the LL's checkpoint, as the original).

        ``probe``: the fixed rows both score; returns the probe gap between the snapshot and the LL afterwards (0:
        the snapshot holds the LL's weights)."""
        ll.save_checkpoint(str(begin_refresh(self.root, step)), step)
        folder = commit_refresh(self.root, step)
        self.refresh_probe, _ = ll.compute_log_prob(probe)
        self._load(folder, step)
        gap = float((self.probe_log_probs(probe) - self.refresh_probe).abs().max())
        return {"ll_snapshot/refreshed": 1.0, "ll_snapshot/refresh_probe_gap": gap}

    def _load(self, folder: Path, refreshed_at: int) -> None:
        self.group.load_checkpoint(str(folder))
        self.group.weights_changed()
        self.refreshed_at = refreshed_at
        logger.info("LL snapshot loaded from %s (the LL of step %d)", folder, refreshed_at)

    def probe_log_probs(self, probe) -> torch.Tensor:
        """The snapshot actor's log-probs of the probe rows."""
        return self.group.compute_log_prob(probe)[0]

    def generation_metrics(self, ll: PolicyGroup, probe) -> dict[str, float]:
        """Which weights generate this step's R_ref: the refresh step, the probe gap to the LL's at that refresh (0)
        and to the current LL's (> 0 once the LL has been updated since the refresh)."""
        snapshot = self.probe_log_probs(probe)
        current, _ = ll.compute_log_prob(probe)
        return {
            "ll_snapshot/weights_step": self.refreshed_at,
            "ll_snapshot/probe_logprob_sum": float(snapshot.sum()),
            "ll_snapshot/probe_gap_to_refresh": float((snapshot - self.refresh_probe).abs().max()),
            "ll_snapshot/probe_gap_to_ll": float((snapshot - current).abs().max()),
        }

    def save(self, checkpoint: Path, step: int) -> dict:
        """Save the snapshot into ``checkpoint/ll_snapshot``; returns its part of the trainer state."""
        self.group.save_checkpoint(str(checkpoint / CHECKPOINT_FOLDER), step)
        return {"refreshed_at": self.refreshed_at, "refresh_probe": self.refresh_probe}

    def restore(self, checkpoint: Path, step: int, saved: dict, ll: PolicyGroup, probe) -> None:
        """On resume: the snapshot saved in ``checkpoint`` (see :func:`restore_source`)."""
        folder, refreshed_at, refresh_probe = restore_source(checkpoint, step, saved)
        if folder is not None:
            self._load(folder, refreshed_at)
        self.refresh_probe = refresh_probe if refresh_probe is not None else self.probe_log_probs(probe)
        self.refreshed_at = refreshed_at

    def start(self, ll: PolicyGroup, probe) -> None:
        """A fresh run: the snapshot holds the LL's initial weights (its "refresh" at step 0)."""
        self.refresh_probe, _ = ll.compute_log_prob(probe)

    def refine(
        self, episodes: list[Episode], tokenizer, max_tokens: int, temperature: float, step: int
    ) -> list[list[list[Turn]]]:
        """One snapshot refinement per LL refinement, from the same turn-3 prompt ids: ``[problem][attempt][k]``."""

        stop_ids = set(stop_tokens(tokenizer.name_or_path, tokenizer)[0])

        async def one(prompt: Prompt, request_id: str) -> Turn:
            output = await self.group.generate(prompt.ids, max_tokens, temperature, request_id)
            return turn_from_output(prompt, output, tokenizer, max_tokens, stop_ids)

        async def run() -> list[Turn]:
            jobs = [
                one(r.refinement.prompt, f"snap/s{step}/p{e.problem_index}/a{j}/f{k}")
                for e in episodes
                for j, attempt in enumerate(e.attempts)
                for k, r in enumerate(attempt.refinements)
            ]
            return list(await asyncio.gather(*jobs))

        self.group.wake_up(step)  # no push when the step's wake-up gave the servers the weights (weight_sync.py)
        flat = iter(asyncio.run(run()))
        return [[[next(flat) for _ in attempt.refinements] for attempt in e.attempts] for e in episodes]
