"""MLMTTrainer: the two-policy training loop (DESIGN.md §5). Its ``fit()`` is the one loop of the project.

One step (``mlmt.feedback=model``, the default): sample B problems → LL attempts (n each) → HL feedbacks (m per
attempt) → LL refinements → rewards R1/R3 → per-turn rewards and advantages per level (verl's estimators, nested
groups) → update the level(s) whose turn it is ((tH, tL) schedule, LL first; frozen levels never) → sync their
weights into their rollout servers → log, validate, checkpoint. Rows are built from the exact token ids the
servers returned.

The baselines run the same loop without an HL (no HL workers are started): ``mlmt.feedback=self`` replaces the
feedback turn with the fixed self-correction instruction (SCoRe: attempt, then a second attempt that is trained
as turn 3), ``mlmt.feedback=none`` stops after turn 1 (single-turn GRPO, reward R1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from verl import DataProto

from agent_system import verl_compat as vc
from agent_system.multi_turn_rollout.batch import build_rows, padding_id
from agent_system.multi_turn_rollout.episode import Episode, EpisodeRunner, EpisodeSettings
from agent_system.prompts.templates import Task
from agent_system.rewards import leak
from agent_system.rewards.yaml_reward import grading_context
from agent_system.trainer import advantages as adv
from agent_system.trainer import plan as run_plan
from agent_system.trainer import state as st
from agent_system.trainer import value_shaping as vs
from agent_system.trainer.metrics import episode_metrics, plot_history, trajectory_records
from agent_system.trainer.policy import SyncCounter, awake
from agent_system.trainer.ref_refresh import ReferenceRefresh
from agent_system.trainer.schedule import levels_to_update
from agent_system.trainer.stop_request import STOP_REQUEST
from agent_system.trainer.turn_kl import TURN_KL_COEF

logger = logging.getLogger(__name__)


class MLMTTrainer:
    """Owns the two :class:`PolicyGroup` s, the reward pool, the sampler and the tracker."""

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
    ) -> None:
        self.config, self.mlmt = config, config.mlmt
        self.snapshot = snapshot  # LaggedSnapshot: reference solver of the contrastive HL reward, or None
        self.ref_refresh = ReferenceRefresh(config.mlmt.ll.ref_refresh_freq, tokenizers["ll"])  # LL reference ← actor
        self.groups, self.critics, self.tokenizers = groups, critics, tokenizers
        self.runner, self.reward_pool = runner, reward_pool
        self.sampler = st.ProblemSampler(
            train_frame, config.data.train_batch_size, config.data.seed, config.data.shuffle
        )
        self.val_frame = val_frame
        self.out_dir = Path(config.trainer.default_local_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.global_step = 0
        self.history: list[dict] = []
        # what the run will do (run_plan.json), checked against self.history when fit() ends
        self.plan = run_plan.build_plan(config, len(train_frame), None if val_frame is None else len(val_frame))
        self.tracker = vc.Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=list(config.trainer.logger),
            config=OmegaConf.to_container(config, resolve=True),
        )

    # ------------------------------------------------------------------------------------------------ the loop
    def fit(self) -> dict:
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
        syncs = SyncCounter([*self.groups.values(), *([self.snapshot.group] if self.snapshot else [])])
        if self.config.trainer.val_before_train and self.global_step == 0 and self.val_frame is not None:
            first_metrics = self.validate() | syncs.take()
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
            with _timer(timing, "generate"):
                problems = self.sampler.next_batch()  # B rows
                episodes = self.rollout(problems, validate=False)
                references = self.snapshot_refinements(episodes)
            with _timer(timing, "reward"):
                scores = self.score(problems, episodes, references)
            metrics = episode_metrics(episodes, scores, prefix="train")
            if references is not None:  # which weights generated R_ref (the LL's of the last refresh)
                metrics.update(self.snapshot.generation_metrics(self.groups["ll"], self._probe("ll")))
            frozen = {k: k not in self.groups or self.mlmt[k].freeze for k in ("ll", "hl")}  # no HL: the LL alone
            active = levels_to_update(step, self.mlmt.schedule, frozen)
            stage_index, stage = adv.stage_at(self.mlmt.stages, step)
            metrics["train/stage_id"] = stage.stage_id
            metrics["train/stage_index"] = stage_index  # the plan check compares these two records
            metrics.update({f"{level}/updated": 1.0 for level in active})
            metrics.update(self.train_levels(active, problems, episodes, scores, stage, timing))
            if self.ref_refresh.due(step):
                with _timer(timing, "ref_refresh"):
                    metrics.update(self.ref_refresh.refresh(self.groups["ll"]))
            if self.snapshot is not None and self.snapshot.due(step):
                with _timer(timing, "snapshot_refresh"):
                    metrics.update(self.snapshot.refresh(self.groups["ll"], step, self._probe("ll")))
            metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
            metrics["perf/generated_tokens_per_s"] = metrics["train/generated_tokens"] / max(timing["generate"], 1e-9)
            if self._due(self.config.trainer.test_freq, step, total) and self.val_frame is not None:
                last_val = self.validate()
                metrics.update(last_val)
            metrics.update(syncs.take())  # perf/weight_syncs/<level>: pushes actor -> rollout servers this step
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
        stop.uninstall()
        plot = plot_history(self.history, self.out_dir / "mlmt_progress.png")
        run_plan.check_run(self.plan, self.config, self.history, self.global_step)  # PlanMismatch on a difference
        return {
            "first_val": first_metrics,
            "last_val": last_val,
            "plot": plot,
            "out_dir": str(self.out_dir),
            "stopped_at": stopped_at,  # the last step when stopped early on request (SIGUSR1 / SIGTERM), else None
        }

    @staticmethod
    def _due(freq: int, step: int, total: int) -> bool:
        return freq > 0 and (step % freq == 0 or step == total)

    # ------------------------------------------------------------------------------------------------ phases
    def rollout(self, problems: list[dict], validate: bool) -> list[Episode]:
        """Run the three-turn episodes (greedy, n = m = 1 when validating)."""
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
        with awake(self.groups.values(), self.global_step):  # inside validate()'s session: no wake, no sleep
            return asyncio.run(self.runner.run(tasks, settings))

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

    def score(self, problems: list[dict], episodes: list[Episode], references: list | None = None) -> dict:
        """R1 per attempt (B, n), R3 per refinement (B, n, m) and, for the contrastive HL reward, R_ref: per attempt
        (B, n) from the no-feedback refinement, or per feedback (B, n, m) from ``references`` (the lagged snapshot's
        refinements, ``[problem][attempt][k]``). Graded in worker processes."""
        items, shape_n, shape_m = [], len(episodes[0].attempts), len(episodes[0].attempts[0].refinements)
        for i, (row, episode) in enumerate(zip(problems, episodes, strict=True)):
            for j, attempt in enumerate(episode.attempts):
                turns = [attempt.attempt] + [r.refinement for r in attempt.refinements]
                if attempt.no_feedback_refinement is not None:
                    turns.append(attempt.no_feedback_refinement)
                if references is not None:
                    turns += references[i][j]
                context = [grading_context(row, t.prompt_ids, self.tokenizers["ll"]) for t in turns]  # yaml_task
                items += [reward_item(row, t.text, c) for t, c in zip(turns, context, strict=True)]
        flat = np.array([r["score"] for r in self.reward_pool.score(items)], dtype=np.float64)
        extra = 1 if episodes[0].attempts[0].no_feedback_refinement is not None else 0
        extra += shape_m if references is not None else 0
        grid = flat.reshape(len(episodes), shape_n, 1 + shape_m + extra)
        scores = {"r1": grid[:, :, 0], "r3": grid[:, :, 1 : 1 + shape_m]}
        if references is not None:
            scores["r_ref"] = grid[:, :, 1 + shape_m :]  # (B, n, m)
        elif extra:
            scores["r_ref"] = grid[:, :, -1]  # (B, n)
        scores.update(leak.leak_scores(problems, episodes, self.reward_pool))  # "leak" (B, n, m): feedback states y*
        return scores

    def train_levels(
        self, levels: list[str], problems, episodes, scores, stage, timing: dict, concurrent: bool = True
    ) -> dict[str, float]:
        """Log-probs, advantages, update and weight sync of each level in ``levels``.

        With two levels, each level's blocking calls run in a driver thread of its own, so the two worker groups
        (separate resource pools with ``placement=split``) work at the same time. Both batches are built before
        either update, so every log-prob (including the LL's, scored for the HL's confidence term) is taken with
        this step's pre-update weights, as in the sequential order. ``concurrent=False`` runs the levels one after
        the other (for the benchmark's comparison).

        Calls to one worker group are never submitted from two threads at once: with several ranks, two interleaved
        submissions could reach the ranks in different orders and deadlock their collectives. Hence the levels run
        concurrently only with ``placement=split`` (colocated levels share processes), and the log-prob passes run
        one after the other when the HL's confidence term also scores with the LL's workers.
        """

        def build(level: str) -> DataProto:
            with _timer(timing, f"log_prob_{level}"):
                return self.build_level_batch(level, problems, episodes, scores, stage)

        def update(level: str, batch: DataProto) -> dict[str, float]:
            with _timer(timing, f"update_{level}"):
                metrics = self.update_level(level, batch)
            with _timer(timing, f"sync_{level}"):
                self.groups[level].sync_weights(self.global_step)
            return metrics

        if self.mlmt.reward.get("hl_reward") == "value_shaped":
            # the HL's reward reads the LL's critic (one thread: they share no worker group otherwise) before its
            # update; with value_grad=full the critic's loss reads the HL's log-probs
            batches = {level: build(level) for level in levels}
            if self.mlmt.value_shaping.value_grad == "full":
                batches["ll"].batch[vs.HL_LOG_PROB_WEIGHT] = vs.critic_weights(batches["ll"], batches["hl"])
            return {k: v for level in levels for k, v in update(level, batches[level]).items()}
        if len(levels) < 2 or not concurrent or self.mlmt.placement != "split":
            return {k: v for level in levels for k, v in update(level, build(level)).items()}
        with ThreadPoolExecutor(max_workers=len(levels), thread_name_prefix="mlmt_level") as pool:
            if self.mlmt.reward.confidence_lambda > 0:  # the HL's build also calls the LL's workers
                batches = {level: build(level) for level in levels}
            else:
                batches = dict(zip(levels, pool.map(build, levels), strict=True))
            results = list(pool.map(lambda level: update(level, batches[level]), levels))
        return {k: v for result in results for k, v in result.items()}

    def build_level_batch(self, level: str, problems, episodes: list[Episode], scores, stage) -> DataProto:
        """Rows of one level with per-turn rewards on the last token and advantages from the level's estimator."""
        rows = _level_rows(level, episodes)
        pad = padding_id(self.tokenizers[level])
        batch = build_rows(
            rows["prompts"],
            rows["responses"],
            pad,
            rows["log_probs"],
            {"turn": rows["turn"], "problem": rows["problem"]},
        )
        group = self.groups[level]
        old_log_probs, entropy = group.compute_log_prob(batch)  # (N, R) each
        batch.batch["old_log_probs"] = old_log_probs
        mask = batch.batch["response_mask"].float()
        kl = np.zeros(len(batch))
        if group.use_ref:
            ref = group.compute_ref_log_prob(batch)  # (N, R)
            batch.batch["ref_log_prob"] = ref  # read by verl's actor loss when actor.use_kl_loss=true
            kl = ((old_log_probs - ref) * mask).sum(-1).numpy()
        values = None
        if level in self.critics:
            values = self.critics[level].compute_values(batch)  # (N, R)
            batch.batch["values"] = values
        archer_metrics = {}
        if self.mlmt[level].adv_estimator == "archer":  # ArCHer: the utterance critic trains, then scores the rows
            values, archer_metrics = self.critics["archer"].advantage_values(episodes, scores, rows, mask)
        hl_extra, feedback_values = None, None
        if level == "hl" and self.mlmt.reward.confidence_lambda > 0:
            hl_extra = self.confidence_terms(problems, episodes, rows)
        if level == "hl":  # mlmt.reward.leak_penalty: minus the penalty on the rows whose feedback states the answer
            hl_extra = leak.hl_leak_penalty(scores, rows, self.mlmt.reward.get("leak_penalty", 0.0), hl_extra)
        if level == "hl" and self.mlmt.reward.hl_reward == "value_shaped":
            feedback_values = self.feedback_values(episodes)
        result = adv.level_advantages(
            level,
            rows,
            scores,
            kl,
            stage,
            self.mlmt,
            self.config.algorithm,
            batch.batch["response_mask"],
            values,
            hl_extra,
            feedback_values,
        )
        advantages, rewards = result.advantages, result.task_rewards
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = result.returns
        if group.turn_kl_loss:  # the actor's loss adds β·kl per token, β of the row's turn (turn_kl.py)
            batch.batch[TURN_KL_COEF] = torch.as_tensor(result.kl_coef, dtype=torch.float32)
        lengths = mask.sum(-1)
        # The rollout server sampled these tokens; the actor re-scores them. A gap means a stale or wrong weight sync.
        gap = (old_log_probs - batch.batch["rollout_log_probs"]).abs() * mask
        batch.meta_info["metrics"] = {
            f"{level}/rollout_actor_logprob_diff_max": float(gap.max()),
            f"{level}/rollout_actor_logprob_diff_mean": float(gap.sum() / mask.sum()),
            f"{level}/reward_mean": float(rewards.mean()),
            f"{level}/advantage_mean": float((advantages * mask).sum() / mask.sum()),
            f"{level}/advantage_abs_mean": float((advantages.abs() * mask).sum() / mask.sum()),
            f"{level}/kl_mean": float(kl.mean()),
            f"{level}/kl_penalty_mean": float(result.kl_penalty.mean()),  # in the advantages (kl_in=advantage)
            f"{level}/kl_coef_mean": float(result.kl_coef.mean()),
            f"{level}/entropy": float((entropy * mask).sum() / mask.sum()),
            f"{level}/response_length": float(lengths.mean()),
            f"{level}/rows": len(batch),
        }
        batch.meta_info["metrics"].update(archer_metrics)
        if (level == "ll" and self.mlmt.ll.adv_estimator == "value_baseline") or feedback_values is not None:
            batch.meta_info["metrics"].update(vs.level_metrics(level, values, result.returns, feedback_values, mask))
        if result.r3_advantages is not None:
            # how far the HL reward moves the advantages from those of S2 = R3 (0: the shaping cancels in its groups)
            task_advantages = advantages + torch.as_tensor(result.kl_penalty, dtype=advantages.dtype)[:, None] * mask
            r3_gap = (task_advantages - result.r3_advantages).abs()
            batch.meta_info["metrics"]["hl/advantage_gap_to_r3"] = float((r3_gap * mask).sum() / mask.sum())
        return batch

    def update_level(self, level: str, batch: DataProto) -> dict[str, float]:
        metrics = dict(batch.meta_info.pop("metrics"))
        if level in self.critics:
            metrics.update({f"{level}/{k}": v for k, v in self.critics[level].update(batch).items()})
        update = self.groups[level].update_actor(batch)
        metrics.update({f"{level}/{k.removeprefix('actor/')}": v for k, v in update.items()})
        return metrics

    def feedback_values(self, episodes: list[Episode]) -> np.ndarray:
        """V(x, z, g) of each HL row: the solver critic's value of the turn-3 prompt the feedback leads to (position 0
        of the turn-3 row); the LL's turn-3 rows are in the HL rows' order (one per feedback)."""
        rows = _level_rows("ll", episodes)
        turn3 = [i for i, turn in enumerate(rows["turn"]) if turn == 3]
        prompts = [rows["prompts"][i] for i in turn3]
        batch = build_rows(prompts, [rows["responses"][i] for i in turn3], padding_id(self.tokenizers["ll"]))
        return self.critics["ll"].compute_values(batch)[:, 0].numpy()

    def confidence_terms(self, problems, episodes: list[Episode], rows: dict[str, list]) -> np.ndarray:
        """Per HL row: λ·clip(mean log p_LL(y*|x,z,g) − mean log p_LL(y*|x,z)), y* = the dataset's reference.

        The prompt with feedback is the turn-3 prompt the LL already saw; the one without feedback and the tokenized
        reference are built once per attempt and per problem. Both sets are scored in one ``compute_log_prob``.
        """
        tokenizer, prompts = self.tokenizers["ll"], self.runner.prompts
        limit, budget = self.config.data.max_response_length, self.config.data.max_prompt_length
        references, no_feedback = {}, {}
        with_feedback, without_feedback, targets = [], [], []
        for i, j, k in zip(rows["problem"], rows["attempt"], rows["feedback"], strict=True):
            episode, attempt = episodes[i], episodes[i].attempts[j]
            if i not in references:
                reference = (problems[i].get("extra_info") or {}).get("reference_solution") or ""
                references[i] = tokenizer(reference, add_special_tokens=False)["input_ids"][:limit]
                if not references[i]:  # checked at data load; never score a placeholder token instead
                    raise ValueError(f"problem {problems[i]['prompt'][0]['content']!r}: empty reference_solution")
            if (i, j) not in no_feedback:
                no_feedback[i, j] = prompts.refine(episode.task, attempt.attempt.text, None, tokenizer, budget).ids
            targets.append(references[i])
            with_feedback.append(attempt.refinements[k].refinement.prompt_ids)
            without_feedback.append(no_feedback[i, j])
        batch = build_rows(with_feedback + without_feedback, targets + targets, padding_id(tokenizer))
        log_probs, _ = self.groups["ll"].compute_log_prob(batch)  # (2N, R)
        mask = batch.batch["response_mask"].float()
        mean_logp = ((log_probs * mask).sum(-1) / mask.sum(-1)).numpy()  # (2N,)
        reward, count = self.mlmt.reward, len(targets)
        return adv.confidence_bonus(
            mean_logp[:count], mean_logp[count:], reward.confidence_lambda, reward.confidence_clip
        )

    def validate(self) -> dict[str, float]:
        """The same three-turn episode and prompts as training, greedy, over the validation set.

        Every validation episode is written to ``trajectories/val_step_N.jsonl``.
        """
        size = self.config.data.val_batch_size
        results, records = defaultdict(list), []
        with awake(self.groups.values(), self.global_step):  # one wake-up (and weight sync) for all the batches
            for start in range(0, len(self.val_frame), size):
                problems = [r.to_dict() for _, r in self.val_frame.iloc[start : start + size].iterrows()]
                episodes = self.rollout(problems, validate=True)
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
            if not self.mlmt[level].freeze:
                group.save_checkpoint(str(folder / level), self.global_step)
        if self.ref_refresh.enabled:
            self.ref_refresh.save(self.groups["ll"], folder)
        for level, critic in self.critics.items():
            critic.save_checkpoint(str(folder / f"{level}_critic"), self.global_step)
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
                group.sync_weights(step)
        for level, critic in self.critics.items():
            if (folder / f"{level}_critic").is_dir():
                critic.load_checkpoint(str(folder / f"{level}_critic"))
        if self.snapshot is not None:
            self.snapshot.restore(folder, step, saved, self.groups["ll"], self._probe("ll"))
        reference_gap = self.ref_refresh.restore(self.groups["ll"], folder) if self.ref_refresh.enabled else {}
        self.global_step = saved["global_step"]
        self.sampler.load_state_dict(saved["sampler"])
        self.history = saved["history"]
        st.set_rng_state(saved["rng"])
        restored = self._probe_log_probs()
        gaps = {
            f"resume/{lv}_logprob_max_abs_diff": float((restored[lv] - saved["probe_log_probs"][lv]).abs().max())
            for lv in restored
            if lv in saved["probe_log_probs"]  # ll_snapshot: absent from a checkpoint of a run without one
        } | reference_gap
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


def _level_rows(level: str, episodes: list[Episode]) -> dict[str, list]:
    """Flatten episodes into one level's rows: LL = turn-1 + turn-3 rows, HL = turn-2 rows.

    Turn numbers are the MLMT ones whatever ``mlmt.feedback``: a self-correction (SCoRe's second attempt) is a
    turn-3 row, so it gets turn-3 rewards, groups and β_L."""
    rows = defaultdict(list)

    def add(turn, number, i, j, k):
        rows["prompts"].append(turn.prompt_ids)
        rows["responses"].append(turn.response_ids or [0])
        rows["log_probs"].append(turn.log_probs or [0.0])
        rows["turn"].append(number)
        rows["problem"].append(i)
        rows["attempt"].append(j)
        rows["feedback"].append(k)

    for episode in episodes:
        for j, attempt in enumerate(episode.attempts):
            if level == "ll":
                add(attempt.attempt, 1, episode.problem_index, j, 0)
            for k, refinement in enumerate(attempt.refinements):
                if level == "ll":
                    add(refinement.refinement, 3, episode.problem_index, j, k)
                else:
                    add(refinement.feedback, 2, episode.problem_index, j, k)
    return rows


class _timer:
    def __init__(self, sink: dict, name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.sink[self.name] = self.sink.get(self.name, 0.0) + time.perf_counter() - self.start
