"""verl's own keys that this trainer does not read: set to anything but verl's default, each stops the run naming the
key that replaces it (issue 34, defect 3).

The composed config holds all of verl's ``ppo_trainer`` keys (``mlmt-configs/mlmt_trainer.yaml`` is deltas over it),
but verl's driver (``RayPPOTrainer``, its dataset and reward loop) is replaced by
:mod:`agent_system.trainer.mlmt_trainer`: the keys only that driver reads would be accepted and ignored, as
``algorithm.adv_estimator=reinforce`` once silently ran GRPO. :data:`BYPASSED_VERL_KEYS` lists them (found by
comparing verl's composed default config with what agent_system reads); the keys verl's workers read (``<tree>.actor``,
``.ref``, ``.model``, the rollout server's engine settings) act through verl and are not listed. Defaults come from
verl's composed default config (:func:`agent_system.verl_compat.verl_default_config`), not from copies here.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from agent_system import verl_compat as vc

POLICY = "{policy}"  # a key under each policy tree: actor_rollout_ref (the LL) and hl (the HL)
_DRIVER_DATA = (
    "nothing: the trainer reads the parquet files itself (docs/REWARDS_AND_DATA.md) and fits each prompt to "
    "data.max_prompt_length"
)
_NOTHING = "nothing: verl's driver setting, not used by this trainer; unset it"

# key (or subtree) -> the key that replaces it, or why nothing does (the refusal's "set instead")
BYPASSED_VERL_KEYS = {
    "algorithm.adv_estimator": "mlmt.ll.adv_estimator / mlmt.hl.adv_estimator (each level's estimator)",
    "algorithm.kl_ctrl": "mlmt.stages.beta_turn1 / beta_turn2 / beta_turn3 (β·KL per turn and stage)",
    "algorithm.kl_penalty": "<tree>.actor.kl_loss_type (the estimator of the per-turn KL and of the actor's KL loss)",
    "algorithm.filter_groups": "nothing: DAPO's dynamic sampling is not implemented; every step trains its batch",
    "algorithm.use_pf_ppo": _NOTHING,
    "algorithm.pf_ppo": _NOTHING,
    "algorithm.rollout_correction": "nothing: rollout importance-sampling corrections are not applied",
    "trainer.critic_warmup": "nothing: critics and actors update from step 1 (mlmt.schedule says which level updates)",
    "trainer.balance_batch": "nothing: each level's rows are always balanced over its ranks by length "
    "(agent_system/levels/balance.py); leave it true",
    "trainer.val_only": "the evaluation scripts (docs/EVALUATION.md), or trainer.total_training_steps",
    "trainer.log_val_generations": "nothing: validation episodes are written to <run>/trajectories/val_step_N.jsonl",
    "trainer.rollout_data_dir": "mlmt.trajectories_per_step (episodes written to <run>/trajectories/step_N.jsonl)",
    "trainer.validation_data_dir": "nothing: validation episodes are written to <run>/trajectories/val_step_N.jsonl",
    "trainer.esi_redundant_time": _NOTHING,
    "trainer.checkpoint_callback_class": "an extension (agent_system/trainer/hooks.py)",
    "trainer.default_hdfs_dir": _NOTHING,
    "trainer.del_local_ckpt_after_load": _NOTHING,
    "trainer.v1": "nothing: settings of verl's v1 trainer, which this trainer is not",
    "data.prompt_key": _DRIVER_DATA,
    "data.reward_fn_key": _DRIVER_DATA,
    "data.train_max_samples": _DRIVER_DATA,
    "data.val_max_samples": _DRIVER_DATA,
    "data.gen_batch_size": "data.train_batch_size (problems generated and trained per step)",
    "data.filter_overlong_prompts": _DRIVER_DATA,
    "data.filter_overlong_prompts_workers": _DRIVER_DATA,
    "data.truncation": _DRIVER_DATA,
    "data.custom_cls": _DRIVER_DATA,
    "data.dataloader_num_workers": _DRIVER_DATA,
    "data.validation_shuffle": _DRIVER_DATA,
    "data.return_raw_input_ids": _DRIVER_DATA,
    "data.return_full_prompt": _DRIVER_DATA,
    "data.use_shm": _DRIVER_DATA,
    f"{POLICY}.rollout.n": "mlmt.n (attempts per problem) and mlmt.m (feedbacks per attempt)",
    f"{POLICY}.rollout.val_kwargs": "nothing: validation decodes greedily with n = m = 1 (docs/EVALUATION.md)",
    f"{POLICY}.rollout.do_sample": "<tree>.rollout.temperature (0: greedy)",
    f"{POLICY}.rollout.over_sample_rate": _NOTHING,
    f"{POLICY}.rollout.multi_turn": "mlmt.feedback (the trainer's three-turn episode)",
    f"{POLICY}.rollout.agent.default_agent_loop": "the trainer's episode runner (agent_system/multi_turn_rollout)",
    f"{POLICY}.rollout.agent.agent_loop_config_path": "the trainer's episode runner (agent_system/multi_turn_rollout)",
    f"{POLICY}.rollout.calculate_log_probs": _NOTHING,
    f"{POLICY}.rollout.moe_load_balance_metrics_interval": _NOTHING,
    "ray_kwargs.timeline_json_file": _NOTHING,
    "custom_reward_function": "the task's reward (agent_system/rewards; mlmt.reward)",
    "reward_model": "the task's reward (agent_system/rewards; mlmt.reward)",
    "reward.custom_reward_function": "the task's reward (agent_system/rewards; mlmt.reward)",
    "reward.reward_manager": "the task's reward (agent_system/rewards; mlmt.reward)",
    "reward.reward_model.enable": "the task's reward (agent_system/rewards; mlmt.reward)",
    "sandbox_fusion": "the code reward's own sandbox (docs/CODE_REWARD.md)",
    "reward.sandbox_fusion": "the code reward's own sandbox (docs/CODE_REWARD.md)",
    "distillation.enabled": _NOTHING,
    "transfer_queue.enable": _NOTHING,
    "skip.rollout.enable": _NOTHING,
    "skip.rollout_tq.enable": _NOTHING,
    "skip.async_rollout.enable": _NOTHING,
}
POLICY_TREES = ("actor_rollout_ref", "hl")


def _leaves(value: object, prefix: str) -> dict[str, object]:
    """``{dotted key: value}`` of every leaf under ``prefix`` (``_target_`` keys left out)."""
    if not isinstance(value, dict):
        return {prefix: value}
    found = {}
    for key, item in value.items():
        if not str(key).startswith("_"):
            found.update(_leaves(item, f"{prefix}.{key}"))
    return found


def _plain(config: DictConfig, key: str) -> object:
    node = OmegaConf.select(config, key, default=None, throw_on_resolution_failure=False)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def bypassed_key_errors(config: DictConfig) -> list[str]:
    """One message per key of :data:`BYPASSED_VERL_KEYS` (for each policy tree) whose value differs from verl's."""
    defaults = vc.verl_default_config()
    errors = []
    for pattern, instead in BYPASSED_VERL_KEYS.items():
        for tree in POLICY_TREES if pattern.startswith(POLICY) else (None,):
            key = pattern.replace(POLICY, tree) if tree else pattern
            default_key = pattern.replace(POLICY, "actor_rollout_ref")
            values = _leaves(_plain(config, key), key)
            default_values = _leaves(_plain(defaults, default_key), key)
            changed = [
                f"{leaf}={value!r} (verl's default {default_values.get(leaf)!r})"
                for leaf, value in values.items()
                if value != default_values.get(leaf)
            ]
            if changed:
                errors.append(
                    f"{', '.join(changed)}: verl's key, not read by this trainer; set instead: "
                    f"{instead.replace('<tree>', tree or '<tree>')}"
                )
    return errors
