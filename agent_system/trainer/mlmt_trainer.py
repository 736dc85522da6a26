"""MLMTTrainer: the two-policy training loop (docs/ARCHITECTURE.md). Its ``fit()`` is the one loop of the project.

One step (``mlmt.feedback=model``, the default): sample B problems → LL attempts (n each) → HL feedbacks (m per
attempt) → LL refinements → rewards R1/R3 → per-turn rewards and advantages per level (verl's estimators, nested
groups) → update the level(s) whose turn it is ((tH, tL) schedule, LL first; frozen levels never) → log,
validate, checkpoint. An update reaches the rollout servers at their next wake-up, one push per weight change
(``weight_sync.py``). Rows are built from the exact token ids the servers returned.

The baselines run the same loop without an HL (no HL workers are started): ``mlmt.feedback=self`` replaces the
feedback turn with the fixed self-correction instruction (SCoRe: attempt, then a second attempt that is trained
as turn 3), ``mlmt.feedback=none`` stops after turn 1 (single-turn GRPO, reward R1).

The loop names no method: a method's estimator and task reward come from the registries of ``advantages.py``, its
per-step work from the :class:`~agent_system.trainer.hooks.Extension` s it was given (``agent_system/methods``,
docs/EXTENDING.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from verl import DataProto

from agent_system import verl_compat as vc
from agent_system.config import checkpoints_to_keep, frozen_levels
from agent_system.levels.turn_kl import TURN_KL_COEF
from agent_system.levels.weight_sync import RolloutWeights
from agent_system.multi_turn_rollout.episode import Episode, EpisodeRunner, EpisodeSettings
from agent_system.prompts.templates import Task
from agent_system.rewards import grading_context, leak
from agent_system.trainer import advantages as adv
from agent_system.trainer import state as st
from agent_system.trainer.hooks import Extension
from agent_system.trainer.metrics import episode_metrics, plot_history, trajectory_records
from agent_system.trainer.packing import build_rows, padding_id
from agent_system.trainer.rows import LevelBatch, LevelInputs, LevelRows, StepData, StepScores
from agent_system.trainer.schedule import levels_to_update
from agent_system.trainer.stop_request import STOP_REQUEST

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitSummary:
    """What :meth:`MLMTTrainer.fit` returns (its per-step metrics are in ``MLMTTrainer.history``)."""

    first_val: dict[str, float] | None  # validation before training (step 0), or None
    last_val: dict[str, float] | None  # the last validation, or None
    plot: str | None  # mlmt_progress.png, or None without history
    out_dir: Path
    stopped_at: int | None  # the last step when stopped early on request (SIGUSR1 / SIGTERM), else None


class MLMTTrainer:
    """Owns the two :class:`PolicyGroup` s, their critics (``critics``: level → verl value model, for the levels whose
    estimator reads one), the reward pool, the sampler, the tracker and the methods' extensions."""

    def __init__(
        self,
        config: DictConfig,
        groups: dict,
        critics: dict,
        tokenizers: dict,
        runner: EpisodeRunner,
        reward_pool: Any,
        train_frame,
        val_frame,
        snapshot: Any = None,
        extensions: list[Extension] = (),
        leak_judge: Any = None,
    ) -> None:
        self.config, self.mlmt = config, config.mlmt
        self.leak_judge = leak_judge  # JudgeConfig of mlmt.reward.leak_judge: adds the leaks it finds, or None
        self.snapshot = snapshot  # LaggedSnapshot: reference solver of the contrastive HL reward, or None
        self.extensions = list(extensions)
        self.groups, self.critics, self.tokenizers = groups, critics, tokenizers
        self.rollout_weights = RolloutWeights(
            {**groups, **({snapshot.group.level: snapshot.group} if snapshot else {})},
            config.mlmt.placement,
            reads_other_levels=any(extension.builds_first for extension in self.extensions),
        )
        self.runner, self.reward_pool = runner, reward_pool
        self.sampler = st.ProblemSampler(
            train_frame, config.data.train_batch_size, config.data.seed, config.data.shuffle
        )
        self.val_frame = val_frame
        self.out_dir = Path(config.trainer.default_local_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.global_step = 0
        self.history: list[dict] = []
        self.tracker = vc.Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=list(config.trainer.logger),
            config=OmegaConf.to_container(config, resolve=True),
        )

    # ------------------------------------------------------------------------------------------------ the loop
    def fit(self) -> FitSummary:
        trainer_config = self.config.trainer
        total = st.total_training_steps(
            trainer_config.total_training_steps,
            trainer_config.total_epochs,
            len(self.sampler.frame),
            self.sampler.batch_size,
        )
        self.resume()
        stop = STOP_REQUEST.install()  # SIGUSR1 / SIGTERM: stop after the current step, with a checkpoint
        first_metrics = None
        if self.config.trainer.val_before_train and self.global_step == 0 and self.val_frame is not None:
            first_metrics = self.validate() | self.rollout_weights.take()
            self.tracker.log(first_metrics, step=0)
            self.history.append({"step": 0, **first_metrics})
        last_val = first_metrics
        for step in tqdm(
            range(self.global_step + 1, total + 1),
            desc="MLMT steps",
            initial=self.global_step,
            total=total,
            disable=None,
        ):
            self.global_step = step
            timing: dict[str, float] = {}
            self.rollout_weights.wake(step)  # the pushes (timing_s/sync_<level>) are not part of generate
            with _timer(timing, "generate"):
                problems = self.sampler.next_batch()  # B rows
                episodes = self.rollout(problems, validate=False, round_id=f"s{step}")
                references = self.snapshot_refinements(episodes)
            active = levels_to_update(step, self.mlmt.schedule, frozen_levels(self.config))
            self.rollout_weights.sleep_for_training(active)  # only servers whose devices the training needs
            with _timer(timing, "reward"):
                scores = self.score(problems, episodes, references)
                for extension in self.extensions:  # a method's own verdicts on the step's turns
                    scores = extension.after_scores(self, problems, episodes, scores)
            metrics = episode_metrics(episodes, scores, prefix="train")
            if references is not None:  # which weights generated R_ref (the LL's of the last refresh)
                metrics.update(self.snapshot.generation_metrics(self.groups["ll"], self._probe("ll")))
            stage_index, stage = adv.stage_at(self.mlmt.stages, step)
            metrics["train/stage_id"] = stage.stage_id
            metrics["train/stage_index"] = stage_index  # the plan check compares these two records
            metrics.update({f"{level}/updated": 1.0 for level in active})
            metrics.update(self.train_levels(active, problems, episodes, scores, stage, timing))
            for extension in self.extensions:
                with _timer(timing, extension.name):
                    metrics.update(extension.after_step(self, step))
            if self.snapshot is not None and self.snapshot.due(step):
                with _timer(timing, "snapshot_refresh"):
                    metrics.update(self.snapshot.refresh(self.groups["ll"], step, self._probe("ll")))
            metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
            metrics["perf/generated_tokens_per_s"] = metrics["train/generated_tokens"] / max(timing["generate"], 1e-9)
            if self._due(self.config.trainer.test_freq, step, total) and self.val_frame is not None:
                last_val = self.validate()
                metrics.update(last_val)
            metrics.update(self.rollout_weights.take())  # pushes actor -> rollout servers this step, and their time
            self.tracker.log(metrics, step=step)
            self.history.append({"step": step, **metrics})
            self.write_trajectories(step, problems, episodes, scores)
            if self._due(self.config.trainer.save_freq, step, total):
                self.save_checkpoint(stage_index)
            if stop.requested and step < total:
                if not self._due(self.config.trainer.save_freq, step, total):
                    self.save_checkpoint(stage_index)
                logger.warning("%s: stopped after step %d of %d with a checkpoint", stop.signal_name, step, total)
                break
        stopped_at = self.global_step if stop.requested and self.global_step < total else None
        stop.release()  # after a stop, a repeated warning must not end the process before it exits 75
        plot = plot_history(self.history, self.out_dir / "mlmt_progress.png")
        return FitSummary(first_metrics, last_val, plot, self.out_dir, stopped_at)

    @staticmethod
    def _due(freq: int, step: int, total: int) -> bool:
        return freq > 0 and (step % freq == 0 or step == total)

    # ------------------------------------------------------------------------------------------------ phases
    def rollout(self, problems: list[dict], validate: bool, round_id: str) -> list[Episode]:
        """Run the three-turn episodes (greedy, n = m = 1 when validating); ``round_id`` names the rollout in the
        run (its requests' ids, and so their seeds under ``rollout.full_determinism``)."""
        ll_rollout, hl_rollout = self.config.actor_rollout_ref.rollout, self.config.hl.rollout
        settings = EpisodeSettings(
            n=1 if validate else self.mlmt.n,
            m=1 if validate else self.mlmt.m,
            ll_max_tokens=self.config.data.max_response_length,
            hl_max_tokens=hl_rollout.response_length,
            max_prompt_tokens=self.config.data.max_prompt_length,
            ll_temperature=0.0 if validate else ll_rollout.temperature,
            hl_temperature=0.0 if validate else hl_rollout.temperature,
            with_reference_refinement=not validate and self._contrastive("no_feedback"),
            feedback=self.mlmt.feedback,
        )
        tasks = [Task.from_row(row) for row in problems]
        self.rollout_weights.wake(self.global_step)  # no push when the caller woke the servers (fit, validate)
        return asyncio.run(self.runner.run(tasks, settings, round_id))

    def _contrastive(self, reference: str) -> bool:
        reward = self.mlmt.reward
        if self.mlmt.feedback != "model":
            return False
        return reward.hl_reward == "contrastive" and reward.contrastive_reference == reference

    def snapshot_refinements(self, episodes: list[Episode]) -> list | None:
        """The lagged LL snapshot's refinement of every (x, z, g) turn-3 prompt, for R_ref per feedback (or None)."""
        if self.snapshot is None or not self._contrastive("lagged_snapshot"):
            return None
        rollout = self.config.actor_rollout_ref.rollout
        return self.snapshot.refine(
            episodes, self.tokenizers["ll"], self.config.data.max_response_length, rollout.temperature, self.global_step
        )

    def score(self, problems: list[dict], episodes: list[Episode], references: list | None = None) -> StepScores:
        """R1 per attempt, R3 per refinement and, for the contrastive HL reward, R_ref: per attempt from the
        no-feedback refinement, or per feedback from ``references`` (the lagged snapshot's refinements,
        ``[problem][attempt][k]``). Graded in worker processes."""
        b, n, m = len(episodes), len(episodes[0].attempts), len(episodes[0].attempts[0].refinements)
        no_feedback = references is None and episodes[0].attempts[0].no_feedback_refinement is not None
        r1, r3 = np.full((b, n), np.nan), np.full((b, n, m), np.nan)
        r_ref = np.full((b, n, m if references is not None else 1), np.nan)  # per feedback | per attempt
        cells, items = [], []  # (grid, index) of each graded turn, in the order of items
        for i, (row, episode) in enumerate(zip(problems, episodes, strict=True)):
            for j, attempt in enumerate(episode.attempts):
                turns = [(r1, (i, j), attempt.attempt)]
                turns += [(r3, (i, j, k), r.refinement) for k, r in enumerate(attempt.refinements)]
                if references is not None:
                    turns += [(r_ref, (i, j, k), turn) for k, turn in enumerate(references[i][j])]
                elif no_feedback:
                    turns.append((r_ref, (i, j, 0), attempt.no_feedback_refinement))
                for grid, index, turn in turns:
                    cells.append((grid, index))
                    context = grading_context(row, turn.prompt_ids, self.tokenizers["ll"])
                    items.append(reward_item(row, turn.text, context))
        for (grid, index), result in zip(cells, self.reward_pool.score(items), strict=True):
            grid[index] = result["score"]
        check = leak.leak_scores(problems, episodes, self.reward_pool, self.leak_judge)  # (B, n, m): feedback states y*
        leaks = {"leak": check.leak, "leak_check": check} if check is not None else {}
        if references is not None:
            return StepScores(r1=r1, r3=r3, r_ref_feedback=r_ref, **leaks)
        if no_feedback:
            return StepScores(r1=r1, r3=r3, r_ref_attempt=r_ref[:, :, 0], **leaks)
        return StepScores(r1=r1, r3=r3, **leaks)

    def train_levels(
        self, levels: list[str], problems, episodes, scores, stage, timing: dict, concurrent: bool = True
    ) -> dict[str, float]:
        """Log-probs, advantages and update of each level in ``levels`` (its servers get the weights at the next wake).

        With two levels, each level's blocking calls run in a driver thread of its own, so the two worker groups
        (separate resource pools with ``placement=split``) work at the same time; both batches are built before
        either update, so every log-prob is taken with this step's pre-update weights. ``concurrent=False`` runs the
        levels one after the other (for the benchmark's comparison).

        Calls to one worker group are never submitted from two threads at once: with several ranks, two interleaved
        submissions could reach the ranks in different orders and deadlock their collectives. Hence the levels run
        concurrently only with ``placement=split`` (colocated levels share processes). When an extension's level
        hook reads another level's workers or pre-update state (``Extension.builds_first``), every batch is built,
        one after the other, before any update; ``Extension.before_updates`` then sees all of them.
        """

        def build(level: str) -> LevelBatch:
            with _timer(timing, f"log_prob_{level}"):
                return self.build_level_batch(level, problems, episodes, scores, stage)

        def update(level: str, batch: LevelBatch) -> dict[str, float]:
            with _timer(timing, f"update_{level}"):
                metrics = self.update_level(batch)
            self.groups[level].weights_changed()
            return metrics

        side_by_side = len(levels) > 1 and concurrent and self.mlmt.placement == "split"
        if any(extension.builds_first for extension in self.extensions):
            batches = {level: build(level) for level in levels}  # a level's hook reads the other's pre-update state
        elif side_by_side:
            with ThreadPoolExecutor(max_workers=len(levels), thread_name_prefix="mlmt_level") as pool:
                batches = dict(zip(levels, pool.map(build, levels), strict=True))
        else:
            return {k: v for level in levels for k, v in update(level, build(level)).items()}
        for extension in self.extensions:
            extension.before_updates(self, {level: batch.data for level, batch in batches.items()})
        if not side_by_side:
            return {k: v for level in levels for k, v in update(level, batches[level]).items()}
        with ThreadPoolExecutor(max_workers=len(levels), thread_name_prefix="mlmt_level") as pool:
            results = list(pool.map(lambda level: update(level, batches[level]), levels))
        return {k: v for result in results for k, v in result.items()}

    def build_level_batch(
        self, level: str, problems: list[dict], episodes: list[Episode], scores: StepScores, stage: adv.Stage
    ) -> LevelBatch:
        """Rows of one level with per-turn rewards on the last token and advantages from the level's estimator."""
        rows = LevelRows.of(level, episodes)
        step = StepData(problems=problems, episodes=episodes, scores=scores, stage=stage)
        batch = build_rows(
            rows.prompts,
            rows.responses,
            padding_id(self.tokenizers[level]),
            rows.log_probs,
            {"turn": rows.keys.turn.tolist(), "problem": rows.keys.problem.tolist()},
        )
        group = self.groups[level]
        old_log_probs, entropy = group.compute_log_prob(batch)  # (N, R) each
        batch.batch["old_log_probs"] = old_log_probs
        mask = batch.batch["response_mask"].float()
        inputs = LevelInputs(kl=np.zeros(len(batch)), response_mask=batch.batch["response_mask"])
        if group.use_ref:
            ref = group.compute_ref_log_prob(batch)  # (N, R)
            batch.batch["ref_log_prob"] = ref  # read by verl's actor loss when actor.use_kl_loss=true
            inputs.kl = ((old_log_probs - ref) * mask).sum(-1).numpy()
        if level in self.critics:
            inputs.values = self.critics[level].compute_values(batch)  # (N, R)
            batch.batch["values"] = inputs.values
        extra_metrics = {}
        for extension in self.extensions:
            extra_metrics.update(extension.level_inputs(self, level, step, rows, batch, inputs))
        result = adv.level_advantages(
            level=level,
            rows=rows.keys,
            scores=scores,
            stage=stage,
            mlmt=self.mlmt,
            algorithm=self.config.algorithm,
            inputs=inputs,
        )
        advantages, rewards = result.advantages, result.task_rewards
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = result.returns
        if group.turn_kl_loss:  # the actor's loss adds β·kl per token, β of the row's turn (turn_kl.py)
            batch.batch[TURN_KL_COEF] = torch.as_tensor(result.kl_coef, dtype=torch.float32)
        lengths = mask.sum(-1)
        # The rollout server sampled these tokens; the actor re-scores them. A gap means a stale or wrong weight sync.
        gap = (old_log_probs - batch.batch["rollout_log_probs"]).abs() * mask
        metrics = {
            f"{level}/rollout_actor_logprob_diff_max": float(gap.max()),
            f"{level}/rollout_actor_logprob_diff_mean": float(gap.sum() / mask.sum()),
            f"{level}/reward_mean": float(rewards.mean()),
            f"{level}/advantage_mean": float((advantages * mask).sum() / mask.sum()),
            f"{level}/advantage_abs_mean": float((advantages.abs() * mask).sum() / mask.sum()),
            f"{level}/groups_with_signal": result.groups_with_signal,
            f"{level}/kl_mean": float(inputs.kl.mean()),
            f"{level}/kl_penalty_mean": float(result.kl_penalty.mean()),  # in the advantages (kl_in=advantage)
            f"{level}/kl_coef_mean": float(result.kl_coef.mean()),
            f"{level}/entropy": float((entropy * mask).sum() / mask.sum()),
            f"{level}/response_length": float(lengths.mean()),
            f"{level}/rows": len(batch),
        }
        turns = np.unique(rows.keys.turn)
        if len(turns) > 1:  # the LL's turns: stage I constrains turn 1's KL while turn 3's reward moves the solver
            metrics.update({f"{level}/kl_mean@t{t}": float(inputs.kl[rows.keys.turn == t].mean()) for t in turns})
        metrics.update(extra_metrics)
        for extension in self.extensions:
            metrics.update(extension.level_metrics(level, inputs, result))
        if result.r3_advantages is not None:
            # how far the HL reward moves the advantages from those of S2 = R3 (0: the shaping cancels in its groups)
            task_advantages = advantages + torch.as_tensor(result.kl_penalty, dtype=advantages.dtype)[:, None] * mask
            r3_gap = (task_advantages - result.r3_advantages).abs()
            metrics["hl/advantage_gap_to_r3"] = float((r3_gap * mask).sum() / mask.sum())
        return LevelBatch(level, batch, metrics)

    def update_level(self, batch: LevelBatch) -> dict[str, float]:
        """The level's critic (if it has one) and actor updated on ``batch``; the build's metrics and the update's."""
        level, metrics = batch.level, dict(batch.metrics)
        if level in self.critics:
            metrics.update({f"{level}/{k}": v for k, v in self.critics[level].update(batch.data).items()})
        update = self.groups[level].update_actor(batch.data)
        metrics.update({f"{level}/{k.removeprefix('actor/')}": v for k, v in update.items()})
        return metrics

    def validate(self) -> dict[str, float]:
        """The same three-turn episode and prompts as training, greedy, over the validation set.

        Every validation episode is written to ``trajectories/val_step_N.jsonl``. The servers stay awake after it.
        """
        size = self.config.data.val_batch_size
        results, records = defaultdict(list), []
        self.rollout_weights.wake(self.global_step)  # the weights that changed since the last push, once for all
        for start in range(0, len(self.val_frame), size):
            problems = [r.to_dict() for _, r in self.val_frame.iloc[start : start + size].iterrows()]
            episodes = self.rollout(problems, validate=True, round_id=f"val/s{self.global_step}/b{start}")
            scores = self.score(problems, episodes)
            records += trajectory_records(problems, episodes, scores)
            for key, value in episode_metrics(episodes, scores, prefix="val").items():
                results[key].append((value, len(problems)))
        self._write_jsonl(self.out_dir / "trajectories" / f"val_step_{self.global_step}.jsonl", records)
        metrics = {k: sum(v * w for v, w in vals) / sum(w for _, w in vals) for k, vals in results.items()}
        return metrics | leak.record_leak_metrics(records, "val")  # leak rates pooled over the batches

    # ------------------------------------------------------------------------------------------------ outputs
    def write_trajectories(self, step: int, problems, episodes: list[Episode], scores) -> None:
        count = self.mlmt.trajectories_per_step
        if count > 0:
            records = trajectory_records(problems, episodes, scores)[:count]
            self._write_jsonl(self.out_dir / "trajectories" / f"step_{step}.jsonl", records)

    @staticmethod
    def _write_jsonl(path: Path, records: list[dict]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")

    def save_checkpoint(self, stage_index: int) -> None:
        folder = st.step_dir(self.ckpt_dir, self.global_step)
        for level, group in self.groups.items():
            if not frozen_levels(self.config)[level]:
                group.save_checkpoint(str(folder / level), self.global_step)
        for level, critic in self.critics.items():
            critic.save_checkpoint(str(folder / f"{level}_critic"), self.global_step)
        for extension in self.extensions:
            extension.save(self, folder)
        snapshot = None if self.snapshot is None else self.snapshot.save(folder, self.global_step)
        st.write_trainer_state(
            self.ckpt_dir,
            self.global_step,
            {
                "global_step": self.global_step,
                "sampler": self.sampler.state_dict(),
                "stage_index": stage_index,
                "rng": st.rng_state(),
                "history": self.history,
                "probe_log_probs": self._probe_log_probs(),
                "snapshot": snapshot,  # the lagged LL snapshot's refresh step and the LL's probe then, or None
            },
        )
        st.mark_latest(self.ckpt_dir, self.global_step)
        logger.info("checkpoint saved: %s", folder)
        best = self._best_checkpoint()
        pruned = st.prune_checkpoints(  # last: the new one is complete
            self.ckpt_dir, checkpoints_to_keep(self.config), protect=best
        )
        if pruned:
            logger.info("older checkpoints deleted (trainer.max_actor_ckpt_to_keep): steps %s", pruned)

    def _best_checkpoint(self) -> int | None:
        """With ``trainer.keep_best``: the checkpointed step with the best validation value so far, written to
        ``checkpoints/best_checkpoint.json`` (tmp + rename); None without it or before any validation."""
        metric = self.config.trainer.get("keep_best")
        if not metric:
            return None
        saved = set(st.checkpoint_steps(self.ckpt_dir)) | {self.global_step}
        found = st.best_step(self.history, metric, saved)
        if found is None:
            return None
        step, value = found
        st.write_json(self.ckpt_dir / st.BEST, {"metric": metric, "step": step, "value": value})
        logger.info("best checkpoint by %s: step %d (%.4f)", metric, step, value)
        return step

    def resume(self) -> None:
        """Restore both models, the sampler, the stage history and the RNG from a checkpoint (``trainer.resume_mode``).

        ``resume_path`` loads everything from the ``global_step_N`` folder ``trainer.resume_from_path`` (another
        run's, typically); later checkpoints are written to this run's folder. The lagged LL snapshot comes from the
        same folder (``global_step_N/ll_snapshot``), never from a refresh folder.
        """
        trainer_config = self.config.trainer
        point = st.resume_point(trainer_config.resume_mode, self.ckpt_dir, trainer_config.resume_from_path)
        if point is None:
            if self.snapshot is not None:
                self.snapshot.start(self.groups["ll"], self._probe("ll"))
            return
        root, step = point
        folder = st.step_dir(root, step)
        saved = st.read_trainer_state(root, step)
        for level, group in self.groups.items():
            if (folder / level).is_dir():
                group.load_checkpoint(str(folder / level))
                group.weights_changed()
        for level, critic in self.critics.items():
            if (folder / f"{level}_critic").is_dir():
                critic.load_checkpoint(str(folder / f"{level}_critic"))
        if self.snapshot is not None:
            self.snapshot.restore(folder, step, saved, self.groups["ll"], self._probe("ll"))
        restored_metrics = {}
        for extension in self.extensions:
            restored_metrics.update(extension.restore(self, folder))
        self.global_step = saved["global_step"]
        self.sampler.load_state_dict(saved["sampler"])
        self.history = saved["history"]
        st.set_rng_state(saved["rng"])
        restored = self._probe_log_probs()
        gaps = {
            f"resume/{lv}_logprob_max_abs_diff": float((restored[lv] - saved["probe_log_probs"][lv]).abs().max())
            for lv in restored
            if lv in saved["probe_log_probs"]  # ll_snapshot: absent from a checkpoint of a run without one
        } | restored_metrics
        self.tracker.log(gaps, step=step)
        logger.info("resumed from %s at step %d (%s)", folder, step, gaps)

    def _probe(self, level: str) -> DataProto:
        """A fixed token sequence in ``level``'s vocabulary: its log-probs identify a model's weights."""
        pad = padding_id(self.tokenizers[level])
        vocab = min(len(self.tokenizers[level]), 64)
        return build_rows([[1, 2, 3, 4]], [[(5 + i) % vocab for i in range(8)]], pad)

    def _probe_log_probs(self) -> dict[str, torch.Tensor]:
        """Log-probs of the probe under both actors and the lagged LL snapshot: equal before save and after load."""
        result = {level: group.compute_log_prob(self._probe(level))[0] for level, group in self.groups.items()}
        if self.snapshot is not None:
            result["ll_snapshot"] = self.snapshot.probe_log_probs(self._probe("ll"))
        return result


def reward_item(row: dict, text: str, context: str | None = None) -> dict:
    """One `RewardPool` item: a response to grade against a dataset row (verl parquet schema); ``context``: the text
    before the response that a YAML task's functions read (``prompt_str``)."""
    item = {
        "data_source": row["data_source"],
        "solution_str": text,
        "ground_truth": row["reward_model"]["ground_truth"],
        "extra_info": row.get("extra_info") or {},
    }
    if context is not None:
        item["prompt_str"] = context
    return item


class _timer:
    def __init__(self, sink: dict, name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.sink[self.name] = self.sink.get(self.name, 0.0) + time.perf_counter() - self.start
