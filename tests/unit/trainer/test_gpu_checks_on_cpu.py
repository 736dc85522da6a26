"""Start-up checks of the device path (agent_system/launcher/gpu_checks.py), computed from the facts they take: Ray's
free resources per node, whether flash_attn imports, the devices. No Ray here; the check against a live Ray cluster
runs in tests/integration/test_pool_check_on_cpu.py."""

import pytest

from agent_system.config import ConfigError, compose_config, level_nodes
from agent_system.launcher.gpu_checks import idle_devices_notice, pool_demands, pools_fit_message


def _nodes(count: int, gpus: int, cpus: int = 64) -> dict[str, dict[str, float]]:
    return {f"10.0.0.{i}": {"GPU": float(gpus), "CPU": float(cpus)} for i in range(count)}


def _message(overrides: list[str], nodes: dict[str, dict[str, float]]) -> str | None:
    return pools_fit_message(pool_demands(compose_config(overrides), "GPU"), nodes, "GPU")


def test_two_levels_larger_than_the_node_are_refused_with_what_was_asked_and_what_is_free():
    message = _message(["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=8"], _nodes(1, 8))
    assert message is not None
    assert "mlmt.ll_gpus=8" in message and "mlmt.hl_gpus=8" in message
    assert "in all 16 CPU, 16 GPU" in message and "8 GPU" in message and "1 alive node" in message


def test_pools_that_fit_pass():
    assert _message(["mlmt.ll_gpus=4", "mlmt.hl_gpus=4", "trainer.n_gpus_per_node=8"], _nodes(1, 8)) is None
    # one level per node of a two-node job
    assert (
        _message(["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], _nodes(2, 8))
        is None
    )


def test_a_level_with_more_devices_than_a_node_spans_whole_nodes():
    config = compose_config(["mlmt.ll_gpus=16", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=8", "trainer.nnodes=3"])
    assert level_nodes(config, "ll") == [8, 8] and level_nodes(config, "hl") == [8]
    assert pools_fit_message(pool_demands(config, "GPU"), _nodes(3, 8), "GPU") is None
    assert "LL pool (mlmt.ll_gpus=16), node 2 of 2" in pools_fit_message(
        pool_demands(config, "GPU"), _nodes(2, 8), "GPU"
    )
    single = compose_config(["mlmt.ll_gpus=16", "trainer.n_gpus_per_node=8"])  # one node: the level stays whole
    assert level_nodes(single, "ll") == [16]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["mlmt.ll_gpus=12", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], "use a multiple of 8"),
        (["mlmt.ll_gpus=24", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], "needs 3 nodes .* trainer.nnodes=2"),
    ],
)
def test_a_level_that_is_not_whole_nodes_is_rejected_by_name(overrides, match):
    with pytest.raises(ConfigError, match=f"mlmt.ll_gpus=.*{match}"):
        level_nodes(compose_config(overrides), "ll")


def test_the_lagged_snapshot_under_colocated_placement_is_refused():
    overrides = [
        "mlmt.placement=colocated",
        "trainer.n_gpus_per_node=8",
        "mlmt.reward.hl_reward=contrastive",
        "mlmt.reward.contrastive_reference=lagged_snapshot",
    ]
    message = _message(overrides, _nodes(1, 8))
    assert message is not None and "lagged snapshot pool" in message and "shared pool" in message
    assert _message(overrides[:2], _nodes(1, 8)) is None  # the same run without the snapshot fits


def test_the_archer_critic_device_is_counted():
    overrides = ["mlmt.ll.adv_estimator=archer", "mlmt.archer.num_gpus=1", "mlmt.ll_gpus=4", "mlmt.hl_gpus=4"]
    assert "ArCHer critic (mlmt.archer.num_gpus=1)" in _message([*overrides, "trainer.n_gpus_per_node=8"], _nodes(1, 8))
    assert _message([*overrides, "trainer.n_gpus_per_node=8"], _nodes(1, 9)) is None


def test_each_pool_must_fit_on_one_node_even_when_the_total_is_free():
    # 6 + 6 devices on two nodes of 8: fits one per node; a 12-device level on one node does not fit two nodes of 8
    assert _message(["mlmt.ll_gpus=6", "mlmt.hl_gpus=6", "trainer.n_gpus_per_node=8"], _nodes(2, 8)) is None
    assert _message(["mlmt.ll_gpus=12", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=8"], _nodes(2, 8)) is not None


def test_on_the_cpu_backend_ranks_are_cpu_slots():
    config = compose_config(["mlmt.ll_gpus=12", "mlmt.hl_gpus=12"])
    message = pools_fit_message(pool_demands(config, "CPU"), {"local": {"CPU": 16.0}}, "CPU")
    assert message is not None and "in all 24 CPU" in message and "16 CPU" in message
    assert pools_fit_message(pool_demands(config, "CPU"), {"local": {"CPU": 24.0}}, "CPU") is None


@pytest.fixture
def gpu_config(monkeypatch):
    """What a GPU node composes (no CPU overlay): verl's attention default and packed sequences."""
    from agent_system import verl_plugin

    monkeypatch.setattr(verl_plugin, "CPU_BACKEND_ACTIVE", False)
    return compose_config([])


SECTIONS = ("actor_rollout_ref.model", "hl.model", "critic.model", "hl_critic.model")


def test_without_flash_attn_every_model_of_both_levels_uses_sdpa_unpacked(gpu_config):
    from omegaconf import OmegaConf

    from agent_system.launcher.gpu_checks import attention_fallback

    for section in SECTIONS:  # verl's defaults: flash_attention_2 (unset) on packed sequences
        assert "attn_implementation" not in OmegaConf.select(gpu_config, f"{section}.override_config")
        assert OmegaConf.select(gpu_config, f"{section}.use_remove_padding") is True
    changed = attention_fallback(gpu_config, on_gpu=True, flash_attn=False)
    assert len(changed) == 8
    for section in SECTIONS:
        assert OmegaConf.select(gpu_config, f"{section}.override_config.attn_implementation") == "sdpa"
        assert OmegaConf.select(gpu_config, f"{section}.use_remove_padding") is False
    assert gpu_config.actor_rollout_ref.actor.use_remove_padding is False  # the actor's copy follows its model's


def test_with_flash_attn_or_on_cpu_verls_default_is_kept(gpu_config):
    from omegaconf import OmegaConf

    from agent_system.launcher.gpu_checks import attention_fallback

    before = OmegaConf.to_container(gpu_config)
    assert attention_fallback(gpu_config, on_gpu=True, flash_attn=True) == []
    assert attention_fallback(gpu_config, on_gpu=False, flash_attn=False) == []
    assert OmegaConf.to_container(gpu_config) == before


def test_an_explicit_flash_attention_without_flash_attn_is_rejected_by_name(gpu_config):
    from omegaconf import OmegaConf

    from agent_system.launcher.gpu_checks import attention_fallback

    OmegaConf.update(gpu_config, "hl.model.override_config.attn_implementation", "flash_attention_2", force_add=True)
    with pytest.raises(ConfigError, match="hl.model.override_config.attn_implementation=flash_attention_2"):
        attention_fallback(gpu_config, on_gpu=True, flash_attn=False)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_critic_loader_uses_the_attention_of_the_critic_config(tiny_models, attention):
    import torch
    import verl.utils.model
    from transformers import AutoConfig

    from agent_system import verl_compat

    assert verl.utils.model.load_valuehead_model is verl_compat.load_valuehead_model  # the plugin replaced verl's
    config = AutoConfig.from_pretrained(tiny_models["ll"], attn_implementation=attention)
    config.num_labels = 1
    model = verl.utils.model.load_valuehead_model(tiny_models["ll"], torch.float32, config, False)
    assert model.config._attn_implementation == attention


def test_colocated_levels_default_to_shares_that_fit_and_lengths_to_their_budgets():
    from agent_system.launcher.gpu_checks import prepare_devices

    overrides = ["mlmt.placement=colocated", "data.max_prompt_length=512", "hl.rollout.response_length=40"]
    config = compose_config(overrides)
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5  # verl's default, twice on one device
    assert config.hl.rollout.max_model_len is None  # vLLM would reserve KV cache for the model's whole context
    prepare_devices(config, overrides)
    ll, hl = config.actor_rollout_ref.rollout, config.hl.rollout
    assert (ll.gpu_memory_utilization, hl.gpu_memory_utilization) == (0.35, 0.35)
    assert (ll.max_model_len, hl.max_model_len) == (512 + config.data.max_response_length, 512 + 40)


def test_a_split_run_keeps_verls_memory_share():
    from agent_system.launcher.gpu_checks import rollout_memory

    config = compose_config([])
    rollout_memory(config, set())
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5 == config.hl.rollout.gpu_memory_utilization


@pytest.mark.parametrize(
    ("ll", "hl", "fits"), [(0.5, None, False), (0.4, 0.4, False), (0.3, 0.4, True), (None, 0.3, True)]
)
def test_a_colocated_sum_above_what_fits_is_rejected_naming_both_keys(ll, hl, fits):
    from agent_system.launcher.gpu_checks import override_keys, rollout_memory

    overrides = ["mlmt.placement=colocated"]
    overrides += [] if ll is None else [f"actor_rollout_ref.rollout.gpu_memory_utilization={ll}"]
    overrides += [] if hl is None else [f"hl.rollout.gpu_memory_utilization={hl}"]
    config = compose_config(overrides)
    if fits:
        rollout_memory(config, override_keys(overrides))
        assert config.actor_rollout_ref.rollout.gpu_memory_utilization == (ll or 0.35)
        return
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref.rollout.gpu_memory_utilization=.* \+ hl.rollout.gpu_memory"
    ):
        rollout_memory(config, override_keys(overrides))


def test_a_max_model_len_below_the_budget_is_rejected_by_name():
    from agent_system.launcher.gpu_checks import rollout_memory

    config = compose_config(["hl.rollout.max_model_len=100"])
    with pytest.raises(ConfigError, match="hl.rollout.max_model_len=100 is below"):
        rollout_memory(config, set())


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "mlmt.ll_gpus=2"],
            "larger than trainer.n_gpus_per_node=1",
        ),
        (["hl.rollout.tensor_model_parallel_size=2", "mlmt.hl_gpus=2"], "hl.rollout.tensor_model_parallel_size=2"),
        (
            ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "mlmt.ll_gpus=3", "trainer.n_gpus_per_node=8"],
            "mlmt.ll_gpus=3 is not a multiple of the 2 devices",
        ),
    ],
)
def test_a_replica_larger_than_a_node_or_devices_without_a_replica_are_rejected(overrides, match):
    from agent_system.launcher.gpu_checks import check_replica_sizes

    with pytest.raises(ConfigError, match=match):
        check_replica_sizes(compose_config(overrides))


def test_tensor_parallel_replicas_that_fit_a_node_pass():
    from agent_system.launcher.gpu_checks import check_replica_sizes

    tp2 = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "hl.rollout.tensor_model_parallel_size=2"]
    check_replica_sizes(compose_config([*tp2, "mlmt.ll_gpus=4", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=8"]))
    check_replica_sizes(compose_config([*tp2, "mlmt.placement=colocated", "trainer.n_gpus_per_node=8"]))


def test_verls_ray_runtime_environment_is_merged_under_the_users():
    from agent_system.launcher.gpu_checks import prepare_devices

    mine = "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO"
    config = compose_config([mine])
    assert "VLLM_DISABLE_COMPILE_CACHE" not in str(config.ray_kwargs)
    prepare_devices(config, [mine])
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VLLM_DISABLE_COMPILE_CACHE == "1"  # verl's workaround for vLLM's compile-cache corruption
    assert env.NCCL_DEBUG == "INFO"  # verl's is WARN: the user's value wins


SMI_535 = """
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+------------------------+----------------------+
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
"""


def test_an_old_driver_is_named_with_both_cuda_versions_and_the_fix():
    from agent_system.launcher.gpu_checks import driver_message

    message = driver_message(False, SMI_535, "2.13.0+cu130", "13.0")
    assert "driver 535.104.05" in message and "CUDA 12.2" in message and "built for CUDA 13.0" in message
    assert "older than R580" in message and "Update the NVIDIA driver to R580 or newer" in message
    assert "CUDA forward compatibility (data-center GPUs) or the CUDA 12 set" in message
    assert 'docs/GPU_RUN.md, "Drivers older than R580"' in message
    current = driver_message(False, SMI_535.replace("535.104.05", "580.65.06"), "2.13.0+cu130", "13.0")
    assert "do not agree" in current and "CUDA 12 set" not in current  # a new driver: no older-driver route
    cpu_wheel = driver_message(False, SMI_535.replace("535.104.05", "580.65.06"), "2.13.0+cpu", None)
    assert "is a CPU build" in cpu_wheel and "constraints-gpu.txt" in cpu_wheel


def test_no_message_when_torch_sees_the_gpu_or_no_gpu_is_shown():
    from agent_system.launcher.gpu_checks import driver_message

    assert driver_message(True, SMI_535, "2.13.0+cu130", "13.0") is None
    assert driver_message(False, None, "2.13.0+cpu", None) is None


def test_the_paths_every_node_needs_and_the_shared_storage_message(tmp_path):
    from agent_system.launcher.gpu_checks import invisible_paths_message, shared_paths

    config = compose_config(["mlmt.ll.adv_estimator=gae", f"trainer.default_local_dir={tmp_path}"])
    paths = shared_paths(config)
    assert set(paths) == {
        "actor_rollout_ref.model.path",
        "hl.model.path",
        "critic.model.path",
        "trainer.default_local_dir",
    }
    assert invisible_paths_message({"10.0.0.1": [], "10.0.0.2": []}) is None
    message = invisible_paths_message({"10.0.0.2": [f"hl.model.path={paths['hl.model.path']}"]})
    assert "node 10.0.0.2 does not see hl.model.path=" in message and "shared storage" in message


@pytest.mark.parametrize(
    "key", ["actor_rollout_ref.actor.use_torch_compile", "hl.actor.use_torch_compile", "hl.ref.use_torch_compile"]
)
def test_the_inert_compile_key_is_rejected_naming_the_one_the_engine_reads(key):
    from agent_system.launcher.gpu_checks import check_compile_keys

    check_compile_keys(compose_config([]))  # the shipped config (and its CPU overlay) sets only keys that act
    with pytest.raises(ConfigError, match=f"{key}=false has no effect.*{key.rsplit('.', 1)[0]}.fsdp_config"):
        check_compile_keys(compose_config([f"{key}=false"]))
    check_compile_keys(compose_config([f"{key}=false", f"{key.rsplit('.', 1)[0]}.fsdp_config.use_torch_compile=false"]))


def test_a_bad_plan_device_size_is_refused_at_start_up_by_name():
    from agent_system.launcher.gpu_checks import prepare_devices

    config = compose_config(["mlmt.plan_device_gib=eighty"])
    with pytest.raises(ConfigError, match="mlmt.plan_device_gib='eighty': give the memory of one device in GiB"):
        prepare_devices(config, ["mlmt.plan_device_gib=eighty"])


# ---------------------------------------------------------------- idle devices (issue 33, item 6)


@pytest.mark.parametrize(
    ("overrides", "visible", "used", "has", "keys"),
    [
        ([], 8, 2, 8, ["8 GPUs visible on this node", "mlmt.ll_gpus (now 1) / mlmt.hl_gpus (now 1)",
                       "mlmt.placement=colocated with trainer.n_gpus_per_node=8"]),  # the defaults on an 8-GPU node
        (["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], None, 4, 16,
         ["trainer.nnodes=2 × trainer.n_gpus_per_node=8", "mlmt.ll_gpus (now 2)"]),
        (["mlmt.placement=colocated", "trainer.n_gpus_per_node=4"], 8, 4, 8, ["set trainer.n_gpus_per_node=8"]),
        (["mlmt.feedback=none", "mlmt.n=2", "mlmt.ll_gpus=2"], 4, 2, 4, ["raise mlmt.ll_gpus (now 2), or"]),
    ],
)  # fmt: skip
def test_pools_that_leave_devices_idle_are_noticed_with_the_keys(overrides, visible, used, has, keys):
    notice = idle_devices_notice(compose_config(overrides), visible)
    assert notice is not None and f"use {used} of the job's {has} devices" in notice, notice
    assert f"{has - used} stay idle" in notice and all(key in notice for key in keys), notice


def test_the_idle_notice_does_not_suggest_the_node_size_already_set():
    config = compose_config(["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=8"])
    notice = idle_devices_notice(config, None)
    assert notice is not None and notice.endswith("4 stay idle; raise mlmt.ll_gpus (now 2) / mlmt.hl_gpus (now 2), "
                                                  "or use mlmt.placement=colocated"), notice  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "visible"),
    [
        (["mlmt.ll_gpus=4", "mlmt.hl_gpus=4", "trainer.n_gpus_per_node=8"], 8),
        (["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=4"], None),  # the experiment scripts
        # the lagged snapshot's pool takes the other half: 2 + 2 + 2 of 6
        (["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=6", "mlmt.reward.hl_reward=contrastive",
          "mlmt.reward.contrastive_reference=lagged_snapshot"], 6),
        (["mlmt.placement=colocated", "trainer.n_gpus_per_node=8"], 8),
        ([], None),  # the CPU backend's defaults: one rank per level, trainer.n_gpus_per_node=1
    ],
)  # fmt: skip
def test_no_notice_when_the_pools_use_every_device(overrides, visible):
    assert idle_devices_notice(compose_config(overrides), visible) is None


def test_the_run_plan_carries_the_idle_devices_notice(monkeypatch):
    from agent_system.launcher import plan

    monkeypatch.setattr(plan, "visible_gpus", lambda: 8)
    config = compose_config(["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                             "hl.actor.ppo_mini_batch_size=64"])  # fmt: skip
    notices = plan.build_plan(config, 1000, 10).notices
    assert [n for n in notices if n.startswith("GPUs: the resource pools use 2 of the job's 8 devices")], notices


# ------------------------------------------------------ devices counted per node (issue 42, point 5)


def test_a_node_count_set_to_both_pools_gets_the_per_node_key_in_the_idle_notice():
    config = compose_config(["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=16", "trainer.nnodes=2"])
    notice = idle_devices_notice(config, None)
    assert notice is not None and "use 16 of the job's 32 devices" in notice, notice
    assert "16 stay idle; set trainer.n_gpus_per_node=8 if each node has 8 devices (the key counts the devices of " \
           "one node, not of a pool or of the job), else raise mlmt.ll_gpus (now 8)" in notice, notice  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "visible", "refused"),
    [
        (["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], None, False),
        (["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=8"], None, True),  # 16 on one node of 8
        (["mlmt.ll_gpus=8", "mlmt.hl_gpus=8", "trainer.n_gpus_per_node=16"], 8, True),  # the node sees 8
        (["mlmt.ll_gpus=2", "mlmt.hl_gpus=2", "trainer.n_gpus_per_node=2"], 4, False),  # the node sees 4
        (["mlmt.ll_gpus=5", "mlmt.hl_gpus=5", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"], None, False),
        (["mlmt.ll_gpus=6", "mlmt.hl_gpus=6", "trainer.n_gpus_per_node=8", "trainer.nnodes=1"], None, True),
        (["mlmt.placement=colocated", "trainer.n_gpus_per_node=8"], None, False),
    ],
)  # fmt: skip
def test_pools_the_nodes_cannot_hold_are_refused_before_ray(overrides, visible, refused):
    from agent_system.launcher.gpu_checks import check_pools_fit_nodes

    config = compose_config(overrides)
    if not refused:
        check_pools_fit_nodes(config, visible)
        return
    with pytest.raises(ConfigError, match=r"the run's resource pools do not fit the job's devices \(trainer\.nnodes="):
        check_pools_fit_nodes(config, visible)
