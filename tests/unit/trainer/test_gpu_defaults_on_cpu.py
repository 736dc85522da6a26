"""GPU-first defaults: the base YAML alone (no CPU overlay) carries the paper's math-run settings (docs/METHOD.md,
"The original's runs"), and the CPU overlay restores the small embedded run, so `python -m verl.trainer.main_mlmt
actor_rollout_ref.model.path=X hl.model.path=Y` on a GPU node is a real run and the same command on CPU is today's
2-step job."""

import pytest

from agent_system import verl_plugin
from agent_system.config import compose_config
from agent_system.launcher.main import check_config
from agent_system.launcher.plan import level_rows, mini_batch_cuts

MODELS = [
    "actor_rollout_ref.model.path=meta-llama/Llama-3.2-1B-Instruct",
    "hl.model.path=meta-llama/Llama-3.2-1B-Instruct",
]


@pytest.fixture(scope="module")
def gpu_config():
    """The config a GPU node composes: apply_hardware_overlay is a no-op when the CPU backend is not active."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verl_plugin, "CPU_BACKEND_ACTIVE", False)
        return compose_config(MODELS)


@pytest.fixture(scope="module")
def cpu_config():
    return compose_config(MODELS)


def test_gpu_defaults_are_the_papers(gpu_config):
    c = gpu_config
    assert c.data.train_batch_size == 128
    assert c.data.max_prompt_length == 4096 and c.data.max_response_length == 1024
    assert c.trainer.total_training_steps == 500
    assert c.trainer.save_freq == 50 and c.trainer.test_freq == 50
    assert c.trainer.resume_mode == "auto" and c.trainer.device != "cpu"
    for name in ("actor_rollout_ref", "hl"):
        policy = c[name]
        assert policy.actor.optim.lr == 5e-7, name
        assert policy.actor.optim.lr_scheduler_type == "constant" and policy.actor.optim.lr_warmup_steps_ratio == 0
        assert policy.actor.clip_ratio == 0.2 and policy.actor.entropy_coeff == 0.001
        assert policy.actor.ppo_mini_batch_size == 128
        assert policy.rollout.temperature == 1.0
        assert policy.rollout.name == "vllm" and policy.rollout.dtype == "bfloat16"
        # a whole row (prompt + response) must fit one dynamic micro-batch (verl asserts it)
        assert policy.actor.ppo_max_token_len_per_gpu >= c.data.max_prompt_length + c.data.max_response_length
    assert c.hl.rollout.response_length == 1024  # what the original's HL generated (its max_tokens 512 was ignored)
    assert c.hl.rollout.prompt_length == 4096
    for critic in ("critic", "hl_critic"):
        assert c[critic].ppo_max_token_len_per_gpu >= 4096 + 1024


def test_gpu_config_is_valid(gpu_config, monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)  # the plugin sets it on this CPU machine
    check_config(gpu_config)


def test_cpu_overlay_keeps_the_small_embedded_run(cpu_config):
    assert verl_plugin.CPU_BACKEND_ACTIVE, "this test expects the CPU backend (no GPU)"
    c = cpu_config
    assert (c.data.train_batch_size, c.data.val_batch_size) == (4, 8)  # 4 × 2 attempts: 8 HL groups a step
    assert (c.data.max_prompt_length, c.data.max_response_length, c.hl.rollout.response_length) == (768, 64, 48)
    assert (c.trainer.total_training_steps, c.trainer.save_freq, c.trainer.test_freq) == (2, 2, 2)
    assert c.mlmt.reward.num_workers == 2
    assert (c.mlmt.n, c.mlmt.m) == (2, 3)  # HL groups of 3: an HL learning signal on more steps than groups of 2
    for name, mini_batch in (("actor_rollout_ref", 16), ("hl", 24)):
        actor = c[name].actor
        assert (actor.optim.lr, actor.entropy_coeff, actor.ppo_mini_batch_size) == (1e-6, 0.0, mini_batch)
        assert actor.ppo_max_token_len_per_gpu == 1024  # micro-batch tokens: 768 + 64 fits
    # no level's mini-batch cut: the LL's 32 rows make two optimizer steps of 16, the HL's 24 rows one (with the LL's
    # 16 they were cut to two of 12, a notice on the main job's first screen)
    assert mini_batch_cuts(c) == []
    assert [level_rows(c, level) for level in ("ll", "hl")] == [32, 24]
    assert c.critic.ppo_max_token_len_per_gpu == c.hl_critic.ppo_max_token_len_per_gpu == 4096


def test_user_overrides_beat_the_cpu_overlay():
    c = compose_config(["data.train_batch_size=4", "hl.rollout.response_length=32", "trainer.total_training_steps=3"])
    assert (c.data.train_batch_size, c.hl.rollout.response_length, c.trainer.total_training_steps) == (4, 32, 3)
