"""Config of the MLMT trainer: composition, the CPU overlay, per-level views and start-up validation.

The YAML lives in ``mlmt-configs/`` (deltas over verl's ``ppo_trainer``). Two policy subtrees: ``actor_rollout_ref``
is the solver (LL) and ``hl`` the feedback writer (HL); :func:`level_view` gives each level a config in which its
subtree sits at ``actor_rollout_ref`` (and its critic at ``critic``), which is the shape verl's workers, rollout
servers and clients read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "mlmt-configs"
CPU_OVERLAY = CONFIG_DIR / "overlays" / "cpu.yaml"
LEVELS = ("ll", "hl")
ESTIMATORS = ("grpo", "rloo", "reinforce", "reinforce_plus_plus", "gae")
HL_REWARDS = ("r3", "progress", "contrastive")


class ConfigError(ValueError):
    """An invalid MLMT config; the message names the key and the fix."""


def compose_config(overrides: list[str] | None = None, config_name: str = "mlmt_trainer") -> DictConfig:
    """Compose the trainer config as ``python -m verl.trainer.main_mlmt <overrides>`` would (for tests and tools)."""
    from hydra import compose, initialize_config_dir

    overrides = list(overrides or [])
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        config = compose(config_name, overrides=overrides)
    return apply_hardware_overlay(config, overrides)


def apply_hardware_overlay(config: DictConfig, user_overrides: list[str]) -> DictConfig:
    """On the CPU backend, merge ``overlays/cpu.yaml`` under the user's command-line overrides (which still win)."""
    from agent_system import verl_plugin

    if not verl_plugin.CPU_BACKEND_ACTIVE:
        return config
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with open_dict(config):
        merged = OmegaConf.merge(config, OmegaConf.load(CPU_OVERLAY))
    OmegaConf.set_struct(merged, False)
    for override in OverridesParser.create().parse_overrides(user_overrides):
        if override.is_delete() or override.key_or_group.startswith("hydra"):
            continue
        OmegaConf.update(merged, override.key_or_group, override.value(), merge=False, force_add=True)
    OmegaConf.set_struct(merged, True)
    return merged


def level_view(config: DictConfig, level: str) -> DictConfig:
    """The whole config with ``level``'s policy at ``actor_rollout_ref`` and its critic at ``critic``."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if level == "ll":
        return config
    view = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(view):
        view.actor_rollout_ref = config.hl
        view.critic = config.hl_critic
    return view


def validate_config(config: DictConfig) -> None:
    """Reject invalid combinations at start-up with a message that names the key."""
    mlmt = config.mlmt
    if mlmt.n < 1 or mlmt.m < 1:
        raise ConfigError(f"mlmt.n and mlmt.m must be >= 1 (got n={mlmt.n}, m={mlmt.m})")
    for level in LEVELS:
        estimator = mlmt[level].adv_estimator
        if estimator not in ESTIMATORS:
            raise ConfigError(f"mlmt.{level}.adv_estimator={estimator!r}: choose one of {ESTIMATORS}")
    if mlmt.ll.adv_estimator in ("grpo", "rloo") and mlmt.n < 2:
        raise ConfigError(
            f"mlmt.ll.adv_estimator={mlmt.ll.adv_estimator} groups the n attempts on one problem: set mlmt.n >= 2 "
            "or use reinforce / reinforce_plus_plus / gae for the LL"
        )
    if mlmt.hl.adv_estimator in ("grpo", "rloo") and mlmt.m < 2:
        raise ConfigError(
            f"mlmt.hl.adv_estimator={mlmt.hl.adv_estimator} groups the m feedbacks on one attempt: set mlmt.m >= 2 "
            "or use reinforce / reinforce_plus_plus / gae for the HL"
        )
    if mlmt.ll.turn3_group_by not in ("problem", "attempt"):
        raise ConfigError(f"mlmt.ll.turn3_group_by={mlmt.ll.turn3_group_by!r}: choose problem or attempt")
    if mlmt.ll.turn3_group_by == "attempt" and mlmt.ll.adv_estimator in ("grpo", "rloo") and mlmt.m < 2:
        raise ConfigError("mlmt.ll.turn3_group_by=attempt groups the m refinements of one attempt: set mlmt.m >= 2")
    if mlmt.reward.hl_reward not in HL_REWARDS:
        raise ConfigError(f"mlmt.reward.hl_reward={mlmt.reward.hl_reward!r}: choose one of {HL_REWARDS}")
    from agent_system.prompts.templates import TEMPLATES

    unknown = set(mlmt.prompts.overrides) - set(TEMPLATES)
    if unknown:
        raise ConfigError(f"mlmt.prompts.overrides: unknown template(s) {sorted(unknown)}; known: {sorted(TEMPLATES)}")
    if mlmt.prompts.max_attempt_chars < 200:
        raise ConfigError(f"mlmt.prompts.max_attempt_chars={mlmt.prompts.max_attempt_chars}: use at least 200")
    if mlmt.reward.contrastive_reference != "no_feedback":
        raise ConfigError(
            f"mlmt.reward.contrastive_reference={mlmt.reward.contrastive_reference!r}: only no_feedback is supported "
            "(the LL's refinement with no feedback)"
        )
    if mlmt.reward.confidence_lambda < 0 or mlmt.reward.confidence_clip <= 0:
        raise ConfigError("mlmt.reward.confidence_lambda must be >= 0 and mlmt.reward.confidence_clip > 0")
    if mlmt.placement not in ("split", "colocated"):
        raise ConfigError(f"mlmt.placement={mlmt.placement!r}: choose split or colocated")
    if mlmt.ll.freeze and mlmt.hl.freeze:
        raise ConfigError("mlmt.ll.freeze and mlmt.hl.freeze are both true: nothing would be trained")
    if mlmt.schedule.tH < 0 or mlmt.schedule.tL < 0 or mlmt.schedule.tH + mlmt.schedule.tL == 0:
        raise ConfigError(
            f"mlmt.schedule: tH and tL must be >= 0 and not both 0 (got {mlmt.schedule.tH}, {mlmt.schedule.tL})"
        )
    stages = mlmt.stages
    count = len(stages.schedule)
    for key in ("beta1", "beta2", "beta_l", "beta_h", "alpha", "stage_ids"):
        if len(stages[key]) != count:
            raise ConfigError(f"mlmt.stages.{key} has {len(stages[key])} values; mlmt.stages.schedule has {count}")
    if list(stages.schedule) != sorted(stages.schedule) or stages.schedule[0] != 0:
        raise ConfigError(f"mlmt.stages.schedule must start at 0 and increase (got {list(stages.schedule)})")
    if any(s not in (1, 2) for s in stages.stage_ids):
        raise ConfigError(f"mlmt.stages.stage_ids must contain 1 or 2 (got {list(stages.stage_ids)})")
    uses_kl = any(b > 0 for key in ("beta1", "beta2", "beta_l", "beta_h") for b in stages[key])
    if uses_kl and (mlmt.ll.freeze or mlmt.hl.freeze):
        logger.info("KL coefficients are set; a frozen level's KL is 0 since it never moves from its reference")
    for level, policy in (("ll", config.actor_rollout_ref), ("hl", config.hl)):
        name = "actor_rollout_ref" if level == "ll" else "hl"
        if policy.rollout.name not in ("vllm", "sglang", "hf"):
            raise ConfigError(f"{name}.rollout.name={policy.rollout.name!r}: use vllm (GPU) or hf (CPU)")
        if policy.rollout.name == "hf" and policy.rollout.tensor_model_parallel_size != 1:
            raise ConfigError(f"{name}.rollout.tensor_model_parallel_size must be 1 with rollout.name=hf")
    if config.data.train_batch_size < 1:
        raise ConfigError("data.train_batch_size must be >= 1")
    if os.environ.get("VERL_PLATFORM", "") == "cpu" and config.trainer.device != "cpu":
        raise ConfigError("VERL_PLATFORM=cpu but trainer.device is not cpu: set trainer.device=cpu")
