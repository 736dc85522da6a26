"""Refreshing a level's reference model from its actor: LLM_RL's "stable REINFORCE" (``update_ref_iterations``).

The KL penalty of the LL pulls the policy toward its reference model. With ``mlmt.ll.ref_refresh_freq = N > 0`` the
reference is not the initial model for the whole run but the actor as it was after the LL update of the last step
that is a multiple of N: after that update, every rank copies its actor shard into its reference shard.

How, in verl 0.9.1: the LL's workers are verl's ``ActorRolloutRefWorker`` with role ``actor_rollout_ref``; each
worker process holds both ``self.actor`` and ``self.ref`` (``TrainingWorker`` s, each with its FSDP2 engine whose
``engine.module`` is sharded over the same ranks), but verl exposes no call that writes the reference's weights
(``load_checkpoint`` / ``save_checkpoint`` act on the actor only, and its LoRA "ref in actor" mode only disables
adapters). :class:`RefreshableActorWorker` (the LL's worker class when ``ref_refresh_freq > 0``: the project's
``turn_kl.ActorWorker`` plus these calls) adds three registered calls (``ONE_TO_ALL``: every rank works
on its own shard, no gathering, no file): copy actor → reference, and save / load the reference's shards for
checkpoints. The shards of the two engines must match one for one (same names, same local shapes: the same FSDP
mesh); otherwise the refresh stops with an error naming the parameter.

Resume: the reference is saved with every checkpoint (``<global_step_N>/ll_reference/rank_<r>.pt``, one file per
rank, with the reference's log-probs on a fixed probe) and loaded on resume, so after a resume the reference is
exactly what it was at save time (``resume/ll_reference_logprob_max_abs_diff`` = 0). A checkpoint without that folder
(e.g. another run's, through ``trainer.resume_path``) gets the resumed actor as its reference, with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from agent_system import verl_compat as vc
from agent_system.levels.turn_kl import ActorWorker

logger = logging.getLogger(__name__)

FOLDER = "ll_reference"
PROBE_FILE = "probe_log_probs.pt"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter's local shard (FSDP2 parameters are DTensors; plain tensors are their own shard)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@torch.no_grad()
def copy_parameters(source: torch.nn.Module, target: torch.nn.Module) -> int:
    """Copy every parameter shard of ``source`` into the same-named shard of ``target``; returns the count.

    Raises:
        ValueError: The two modules' parameter names or local shard shapes differ (naming the parameter).
    """
    sources, targets = dict(source.named_parameters()), dict(target.named_parameters())
    if sources.keys() != targets.keys():
        missing = sorted(set(sources) ^ set(targets))[:5]
        raise ValueError(f"actor and reference parameters differ in name: {missing}")
    for name, value in sources.items():
        src, dst = _local(value.data), _local(targets[name].data)
        if src.shape != dst.shape:
            raise ValueError(
                f"parameter {name}: actor shard {tuple(src.shape)} vs reference shard {tuple(dst.shape)} (the two "
                "engines must shard over the same FSDP mesh)"
            )
        dst.copy_(src)
    return len(sources)


def shard_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's parameter shards of ``module``, on the CPU."""
    return {name: _local(p.data).detach().cpu().clone() for name, p in module.named_parameters()}


@torch.no_grad()
def load_shard_state(module: torch.nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Write ``state`` (from :func:`shard_state`) back into ``module``'s shards; ``path`` names the file in errors."""
    params = dict(module.named_parameters())
    if params.keys() != state.keys():
        raise ValueError(
            f"{path}: saved reference parameters do not match the model's: {sorted(set(params) ^ set(state))[:5]}"
        )
    for name, p in params.items():
        local = _local(p.data)
        if local.shape != state[name].shape:
            raise ValueError(
                f"{path}: parameter {name} saved as {tuple(state[name].shape)}, model shard {tuple(local.shape)}"
            )
        local.copy_(state[name])


class RefreshableActorWorker(ActorWorker):
    """The project's actor worker with calls that write its reference model (see the module docstring)."""

    def _engines(self):
        if getattr(self, "ref", None) is None or getattr(self, "actor", None) is None:
            raise RuntimeError("the reference refresh needs role actor_rollout_ref (a reference model at this level)")
        return self.actor.engine.module, self.ref.engine.module

    @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
    def refresh_reference(self) -> int:
        """Copy this rank's actor shards into its reference shards; returns the number of parameters copied."""
        actor, reference = self._engines()
        return copy_parameters(actor, reference)

    @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
    def save_reference(self, folder: str) -> None:
        """Save this rank's reference shards to ``folder/rank_<rank>.pt``."""
        _, reference = self._engines()
        Path(folder).mkdir(parents=True, exist_ok=True)
        torch.save(shard_state(reference), Path(folder) / f"rank_{self.rank}.pt")

    @vc.register(dispatch_mode=vc.Dispatch.ONE_TO_ALL)
    def load_reference(self, folder: str) -> None:
        """Load this rank's reference shards from ``folder/rank_<rank>.pt``."""
        _, reference = self._engines()
        path = Path(folder) / f"rank_{self.rank}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no reference shard for rank {self.rank} (saved with another world size?)")
        load_shard_state(reference, torch.load(path, map_location="cpu", weights_only=True), str(path))


class ReferenceRefresh:
    """The trainer's side: when to refresh, and the reference's part of a checkpoint (``mlmt.ll.ref_refresh_freq``)."""

    def __init__(self, freq: int, tokenizer) -> None:
        from agent_system.trainer.packing import build_rows, padding_id

        self.freq = int(freq)
        vocab = min(len(tokenizer), 64)
        # a fixed token sequence: the reference's log-probs on it identify its weights
        self.probe = build_rows([[1, 2, 3, 4]], [[(5 + i) % vocab for i in range(8)]], padding_id(tokenizer))

    @property
    def enabled(self) -> bool:
        return self.freq > 0

    def due(self, step: int) -> bool:
        """After the LL update of every ``freq``-th step."""
        return self.enabled and step % self.freq == 0

    def refresh(self, group) -> dict[str, float]:
        """Copy the actor into the reference; returns the probe gap between the two afterwards (0: identical)."""
        group.worker_group.refresh_reference()
        actor, _ = group.compute_log_prob(self.probe)
        gap = float((group.compute_ref_log_prob(self.probe) - actor).abs().max())
        logger.info("LL reference refreshed from the actor (probe log-prob gap %.3g)", gap)
        return {"ll/ref_refreshed": 1.0, "ll/ref_refresh_probe_gap": gap}

    def save(self, group, folder: Path) -> None:
        """The reference's shards and its probe log-probs into ``folder/ll_reference``."""
        target = folder / FOLDER
        group.worker_group.save_reference(str(target))
        target.mkdir(parents=True, exist_ok=True)  # the driver's view (the workers may run on other nodes)
        torch.save(group.compute_ref_log_prob(self.probe), target / PROBE_FILE)

    def restore(self, group, folder: Path) -> dict[str, float]:
        """On resume: the saved reference (or the resumed actor when the checkpoint has none); returns the probe gap."""
        source = folder / FOLDER
        if not (source / PROBE_FILE).is_file():
            logger.warning("%s has no saved reference: the resumed actor becomes the LL's reference", source)
            group.worker_group.refresh_reference()
            return {}
        group.worker_group.load_reference(str(source))
        saved = torch.load(source / PROBE_FILE, weights_only=True)
        gap = float((group.compute_ref_log_prob(self.probe) - saved).abs().max())
        return {"resume/ll_reference_logprob_max_abs_diff": gap}
