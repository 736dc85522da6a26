"""ArCHer's utterance-level critic (Zhou et al., 2024; recurve): Q(s, a) and V(s) over turns, trained off-policy.

Selected by ``mlmt.ll.adv_estimator=archer``; settings in ``mlmt.archer`` (mlmt-configs/mlmt_trainer.yaml). The
solver's utterances are the actions of an utterance-level MDP:

    single turn (mlmt.feedback=none):  (s1, a1, R1, -, done)
    two turns (mlmt.feedback=self|model): (s1, a1, 0, s2, not done), (s2, a2, R3, -, done)

s1 = the turn-1 prompt, a1 = the attempt, s2 = the turn-3 prompt (the problem, the attempt and, with
``feedback=model``, the feedback writer's text: for the solver, the feedback is part of the environment), a2 = the
refinement. Every step's transitions go into a replay buffer; the critic then takes ``updates_per_step`` gradient
steps with the TD losses of the paper:

    Q(s, a) → r + γ(1 − done)·V_target(s')        V(s) → Q_target(s, a′),  a′ ~ π(·|s) the current policy

Q's minibatches are sampled from the buffer (seeded). V's target needs an action of the *current* solver at s
(``v_target_action``): ``policy`` (the default) draws V's minibatches from this step's transitions, whose actions
the current solver has just sampled at those very states (the critic trains before the solver's update), so
Q_target(s, a′) is an on-policy sample of V^π(s) at no extra generation; V is then fitted on the states the current
policy visits rather than on the buffer's. ``buffer`` (the earlier, cheaper-to-explain variant) regresses V(s) on
Q_target(s, a) with the buffer's own action a, so V tracks the mixture of past policies that filled the buffer and
Q − V is biased toward their value.

The target network is a full copy of the online one, refreshed by a hard copy every ``target_refresh_every``
critic updates (recurve) instead of the paper's Polyak averaging. The network is a Hugging Face decoder
(``critic_model_path``, by default the solver's model) with two small heads on the hidden state of the last token:
Q reads the tokens of s followed by a, V those of s. The paper's DoubleCritic (two Q and two V heads, min of the
pair) and RoBERTa encoder are simplified to one Q and one V head on a shared decoder.

The token-level actor (the solver) is then updated by verl's PPO with the critic's value of each utterance on every
one of its response tokens: ``actor_signal=advantage`` (the paper: Q(s, a) − V(s)) or ``q`` (recurve: Q(s, a)),
from the online critic after this step's critic updates, detached.

:class:`UtteranceCritic` is plain PyTorch (unit-tested without Ray); :class:`ArcherCritic` hosts one in a single Ray
actor (``mlmt.archer.num_gpus`` devices, 0 on CPU) so the driver stays light, and saves it with the trainer's
checkpoints (``global_step_N/archer_critic/``).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

ACTOR_SIGNALS = ("advantage", "q")
V_TARGET_ACTIONS = ("policy", "buffer")  # mlmt.archer.v_target_action (module docstring)


@dataclass(frozen=True)
class Transition:
    """One utterance step: token ids of the state (the turn's prompt) and action (the response), reward, s', done."""

    state: tuple[int, ...]
    action: tuple[int, ...]
    reward: float
    next_state: tuple[int, ...] | None  # None when done
    done: bool


def episode_transitions(episodes: list, r1: np.ndarray, r3: np.ndarray) -> list[Transition]:
    """The solver's utterance transitions of this step's episodes (module docstring).

    Args:
        episodes: the step's :class:`~agent_system.multi_turn_rollout.episode.Episode` s.
        r1: (B, n) reward of each attempt.
        r3: (B, n, m) reward of each refinement (m = 0 for single-turn episodes).
    """
    out = []
    for episode in episodes:
        i = episode.problem_index
        for j, attempt in enumerate(episode.attempts):
            first = attempt.attempt
            s1, a1 = tuple(first.prompt_ids), tuple(first.response_ids or [0])
            if not attempt.refinements:
                out.append(Transition(s1, a1, float(r1[i, j]), None, True))
            for k, refinement in enumerate(attempt.refinements):
                second = refinement.refinement
                s2 = tuple(second.prompt_ids)
                out.append(Transition(s1, a1, 0.0, s2, False))
                out.append(Transition(s2, tuple(second.response_ids or [0]), float(r3[i, j, k]), None, True))
    return out


class ReplayBuffer:
    """A ring buffer of transitions; minibatches are drawn uniformly with replacement by a seeded generator."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity = capacity
        self.items: list[Transition] = []
        self.position = 0  # next slot to overwrite once full
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, transitions: list[Transition]) -> None:
        for transition in transitions:
            if len(self.items) < self.capacity:
                self.items.append(transition)
            else:
                self.items[self.position] = transition
            self.position = (self.position + 1) % self.capacity

    def sample(self, batch_size: int) -> list[Transition]:
        if not self.items:
            raise ValueError("the replay buffer is empty: add transitions before sampling")
        return [self.items[i] for i in self.rng.integers(0, len(self.items), size=batch_size)]

    def state_dict(self) -> dict:
        return {"items": self.items, "position": self.position, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.items, self.position = list(state["items"]), state["position"]
        self.rng.bit_generator.state = state["rng"]


class UtteranceValueNet(nn.Module):
    """A decoder backbone with a Q head (on s ⊕ a) and a V head (on s), each read at the last token."""

    def __init__(self, model_path: str) -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(model_path, dtype=torch.float32)
        hidden = self.backbone.config.hidden_size
        self.q_head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.v_head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def _last_hidden(self, sequences: list[tuple[int, ...]]) -> torch.Tensor:
        device = next(self.parameters()).device
        lengths = torch.tensor([len(s) for s in sequences], device=device)
        ids = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long, device=device)  # (B, L), right-padded
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence, device=device)
        mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
        hidden = self.backbone(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, H)
        return hidden[torch.arange(len(sequences), device=device), lengths - 1]  # (B, H)

    def q(self, states: list[tuple[int, ...]], actions: list[tuple[int, ...]]) -> torch.Tensor:
        return self.q_head(self._last_hidden([s + a for s, a in zip(states, actions, strict=True)])).squeeze(-1)

    def v(self, states: list[tuple[int, ...]]) -> torch.Tensor:
        return self.v_head(self._last_hidden(states)).squeeze(-1)


class UtteranceCritic:
    """Online and target :class:`UtteranceValueNet`, Adam, the replay buffer and the TD updates.

    Args:
        settings: the ``mlmt.archer`` section (or any object with its attributes).
        device: "cpu" or "cuda"; None: cuda when visible.
    """

    def __init__(self, settings: Any, device: str | None = None) -> None:
        self.gamma, self.batch_size = float(settings.gamma), int(settings.batch_size)
        self.micro_batch_size = int(settings.micro_batch_size)
        self.refresh_every, self.max_grad_norm = int(settings.target_refresh_every), float(settings.max_grad_norm)
        self.v_target_action = str(settings.v_target_action)
        if self.v_target_action not in V_TARGET_ACTIONS:
            raise ValueError(f"mlmt.archer.v_target_action={self.v_target_action!r}: choose one of {V_TARGET_ACTIONS}")
        torch.manual_seed(int(settings.seed))
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.online = UtteranceValueNet(str(settings.critic_model_path)).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=float(settings.lr))
        self.buffer = ReplayBuffer(int(settings.buffer_size), int(settings.seed))
        self.updates = 0  # critic gradient steps so far
        self.refreshes = 0  # hard copies into the target so far

    def add(self, transitions: list[Transition]) -> int:
        self.buffer.add(transitions)
        return len(self.buffer)

    def td_losses(
        self, batch: list[Transition], v_batch: list[Transition] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean squared TD errors of Q on ``batch`` and of V on ``v_batch`` (default ``batch``): V(s) → Q_target(s, a)
        with a = the action of each ``v_batch`` transition (module docstring); targets from the target network."""
        states, actions = [t.state for t in batch], [t.action for t in batch]
        v_batch = batch if v_batch is None else v_batch
        rewards = torch.tensor([t.reward for t in batch], device=self.device)
        not_done = torch.tensor([0.0 if t.done else 1.0 for t in batch], device=self.device)
        with torch.no_grad():
            next_value = torch.zeros(len(batch), device=self.device)
            live = [i for i, t in enumerate(batch) if not t.done]
            if live:
                next_value[live] = self.target.v([batch[i].next_state for i in live])
            q_target = rewards + self.gamma * not_done * next_value
            v_target = self.target.q([t.state for t in v_batch], [t.action for t in v_batch])
        q_loss = ((self.online.q(states, actions) - q_target) ** 2).mean()
        v_loss = ((self.online.v([t.state for t in v_batch]) - v_target) ** 2).mean()
        return q_loss, v_loss

    def update_once(self, batch: list[Transition], v_batch: list[Transition] | None = None) -> dict[str, float]:
        """One Adam step on Q's loss over ``batch`` and V's over ``v_batch`` (default ``batch``; the same length),
        gradient accumulated over micro-batches; then the target's refresh."""
        v_batch = batch if v_batch is None else v_batch
        if len(v_batch) != len(batch):
            raise ValueError(f"V's minibatch has {len(v_batch)} transitions, Q's {len(batch)}: they must match")
        self.optimizer.zero_grad(set_to_none=True)
        q_total = v_total = 0.0
        for start in range(0, len(batch), self.micro_batch_size):
            micro = batch[start : start + self.micro_batch_size]
            q_loss, v_loss = self.td_losses(micro, v_batch[start : start + self.micro_batch_size])
            ((q_loss + v_loss) * len(micro) / len(batch)).backward()
            q_total += q_loss.item() * len(micro) / len(batch)
            v_total += v_loss.item() * len(micro) / len(batch)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.refresh_every == 0:
            self.target.load_state_dict(self.online.state_dict())
            self.refreshes += 1
        return {"q_loss": q_total, "v_loss": v_total, "grad_norm": float(grad_norm)}

    def train(self, updates: int, current: list[Transition] | None = None) -> dict[str, float]:
        """``updates`` steps; mean losses of the steps. Q's minibatches of ``batch_size`` are sampled from the buffer;
        V's, with ``v_target_action=policy``, from ``current`` (this step's transitions: the current policy's actions
        at its states), with ``buffer`` they are Q's.

        Raises:
            ValueError: ``v_target_action=policy`` without this step's transitions.
        """
        if self.v_target_action == "policy" and not current:
            raise ValueError("mlmt.archer.v_target_action=policy: V's target needs this step's transitions (current)")

        def v_batch(batch: list[Transition]) -> list[Transition]:
            if self.v_target_action == "buffer":
                return batch
            return [current[i] for i in self.buffer.rng.integers(0, len(current), size=len(batch))]

        results = []
        for _ in range(updates):
            batch = self.buffer.sample(self.batch_size)
            results.append(self.update_once(batch, v_batch(batch)))
        metrics = {key: float(np.mean([r[key] for r in results])) for key in results[0]} if results else {}
        return {**metrics, "buffer_size": len(self.buffer), "updates": self.updates, "target_refreshes": self.refreshes}

    @torch.no_grad()
    def values(self, states: list[tuple[int, ...]], actions: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """Q(s, a) and V(s) of the online network, (N,) each, in micro-batches."""
        q, v = [], []
        size = self.micro_batch_size
        for start in range(0, len(states), size):
            chunk_s, chunk_a = states[start : start + size], actions[start : start + size]
            q.append(self.online.q(chunk_s, chunk_a).float().cpu())
            v.append(self.online.v(chunk_s).float().cpu())
        return torch.cat(q).numpy(), torch.cat(v).numpy()

    def save(self, path: str) -> None:
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "updates": self.updates,
            "refreshes": self.refreshes,
        }
        torch.save(state, folder / "critic.pt.tmp")
        (folder / "critic.pt.tmp").replace(folder / "critic.pt")

    def load(self, path: str) -> None:
        file = Path(path) / "critic.pt"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no ArCHer critic checkpoint in {path}")
        state = torch.load(file, map_location=self.device, weights_only=False)
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.updates, self.refreshes = state["updates"], state["refreshes"]


def actor_signal(q: np.ndarray, v: np.ndarray, kind: str, normalize: bool) -> np.ndarray:
    """Per-utterance signal for the token-level actor: Q − V (``advantage``) or Q (``q``), optionally whitened."""
    if kind not in ACTOR_SIGNALS:
        raise ValueError(f"mlmt.archer.actor_signal={kind!r}: choose one of {ACTOR_SIGNALS}")
    signal = (q - v if kind == "advantage" else q).astype(np.float64)
    if normalize and len(signal) > 1:
        signal = (signal - signal.mean()) / (signal.std() + 1e-6)
    return signal


class ArcherCritic:
    """The utterance critic in one Ray actor, as the ArCHer extension (``methods/archer``) drives it: started with the
    run, trained and read on every solver batch, saved to ``global_step_N/archer_critic/`` with every checkpoint."""

    def __init__(self, config) -> None:
        self.settings = config.mlmt.archer
        self.actor = None

    def init(self) -> None:
        import ray
        from omegaconf import OmegaConf

        settings = OmegaConf.to_container(self.settings, resolve=True)
        # num_cpus=0: the actor never waits for a CPU slot held by the resource pools (it only needs its device)
        remote = ray.remote(UtteranceCritic).options(num_gpus=settings["num_gpus"], num_cpus=0)
        device = "cuda" if settings["num_gpus"] > 0 else "cpu"
        self.actor = remote.remote(_Settings(settings), device)
        ray.get(self.actor.add.remote([]))  # wait until the model is loaded: start-up errors surface here

    def advantage_values(
        self, episodes: list, scores: Any, rows: Any, response_mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Add this step's transitions, train the critic, and score the LL rows: (N, R) signal on every response
        token, and the ``archer/*`` metrics."""
        import ray

        transitions = episode_transitions(episodes, scores.r1, scores.r3)
        ray.get(self.actor.add.remote(transitions))
        # the step's transitions: the current solver's actions at its states, for V's target (v_target_action=policy)
        metrics = ray.get(self.actor.train.remote(int(self.settings.updates_per_step), transitions))
        states = [tuple(p) for p in rows.prompts]
        actions = [tuple(r) for r in rows.responses]
        q, v = ray.get(self.actor.values.remote(states, actions))
        signal = actor_signal(q, v, self.settings.actor_signal, bool(self.settings.normalize_signal))
        mask = response_mask.float()
        values = torch.as_tensor(signal, dtype=torch.float32)[:, None] * mask  # (N, R)
        metrics = {f"archer/{k}": float(val) for k, val in metrics.items()}
        metrics.update(
            {
                "archer/transitions_added": len(transitions),
                "archer/q_mean": float(q.mean()),
                "archer/v_mean": float(v.mean()),
                "archer/signal_mean": float(signal.mean()),
                "archer/signal_token_abs_mean": float(values.abs().sum() / mask.sum()),
            }
        )
        return values, metrics

    def save_checkpoint(self, path: str, step: int) -> None:
        import ray

        ray.get(self.actor.save.remote(path))

    def load_checkpoint(self, path: str) -> None:
        import ray

        ray.get(self.actor.load.remote(path))


class _Settings:
    """Attribute access to a plain dict of ``mlmt.archer`` (what crosses to the Ray actor)."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update(values)
