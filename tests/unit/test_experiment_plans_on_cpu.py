"""The run plan of every experiment script (mlmt-configs/{math,code}/*.sh) and baseline recipe (recipes/*/run_*.sh):
each stage it declares is reached, each trained level is updated and its lr schedule is completed (peak reached,
horizon = its updates), each optimizer makes the optimizer steps per update listed here, and start-up accepts it
(issue 16, item 2 and the pre-flight plan; issue 34, defect 2).

Each script runs through bash with MLMT_PYTHON set to a stub that records the argv it would give `python -m
verl.trainer.main_mlmt`; that argv is composed in-process as the entry point does. The training-set sizes are those of
the files `python -m agent_system.data.prepare` writes (MATH train: 7,500 problems; MBPP train: 370, the 374 of its
split less the four tasks a constant passes), which epochs-mode runs count their steps from. Each script's GPU run is
estimated on 80 GiB devices (its models' config.json written here), with flash-attn (packed sequences) and without it
(sdpa, padded sequences, the token budgets start-up lowers): none is refused at start-up; a 7B feedback writer on the
default 2 + 2 split is, and a Qwen2.5-1.5B solver without flash-attn has its update's budget lowered to keep the 10 %
margin (issue 43, point 1).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.gpu_checks import attention_fallback, lower_padded_budgets
from agent_system.launcher.main import check_config, check_stages_reached, set_schedule_horizon
from agent_system.launcher.memory_estimate import GIB, MARGIN, overcommit_messages, refuse_overcommit
from agent_system.launcher.plan import build_plan, refuse_small_mini_batches, render_markdown

pytestmark = pytest.mark.external  # runs the bash experiment scripts

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    str(path.relative_to(REPO / "mlmt-configs"))
    for path in [*(REPO / "mlmt-configs" / "math").glob("HL*.sh"), *(REPO / "mlmt-configs" / "code").glob("*.sh")]
)
# the baseline recipes that start the trainer (learning_demo and relay_demo run CPU demos of their own), relative to
# mlmt-configs/
DEMOS = {"learning_demo", "relay_demo"}
RECIPES = sorted(
    f"../{path.relative_to(REPO)}" for path in REPO.glob("recipes/*/run_*.sh") if not DEMOS & set(path.parts)
)
TRAIN_ROWS = {"math": 7500, "code": 370, "..": 7500}  # recipes: MATH's (they run trainer.total_training_steps)
# (effective mini-batch, optimizer steps per update) of each trained level (the plan's rows over its ranks, cut to a
# divisor of the rows): the baselines make 1-5 per update like MLMT's scripts, not ArCHer's former 43 steps of 3 rows
OPTIMIZER_STEPS = {
    "code/HLT_LLT_RR_mbpp.sh": {"ll": (128, 2), "hl": (128, 1)},
    "math/HLF_LLT_RR_1_1.sh": {"ll": (128, 2)},
    "math/HLT_LLF_RR_1_1.sh": {"hl": (128, 1)},
    "math/HLT_LLT_GRPO_1_1.sh": {"ll": (128, 3), "hl": (128, 2)},
    "math/HLT_LLT_RR_1_1.sh": {"ll": (128, 2), "hl": (128, 1)},
    "math/HLT_LLT_RR_1_10.sh": {"ll": (128, 2), "hl": (128, 1)},
    "math/HLT_LLT_RR_1_10_LoRA.sh": {"ll": (64, 2), "hl": (64, 1)},
    "math/HLT_LLT_RR_1_15.sh": {"ll": (128, 2), "hl": (128, 1)},
    "math/HLT_LLT_RR_1_20.sh": {"ll": (128, 2), "hl": (128, 1)},
    "math/HLT_LLT_RR_5_20.sh": {"ll": (128, 2), "hl": (128, 1)},
    "../recipes/archer/run_archer.sh": {"ll": (126, 1)},  # 126 problems on 3 solver ranks
    "../recipes/custom_yaml/run_custom_yaml.sh": {"ll": (96, 2), "hl": (128, 1)},
    "../recipes/fixed_feedback/run_fixed_feedback.sh": {"ll": (128, 2)},
    "../recipes/grpo/run_grpo.sh": {"ll": (128, 4)},
    "../recipes/hl_only/run_hl_only.sh": {"hl": (128, 1)},
    "../recipes/reinforce_kl/run_reinforce_kl.sh": {"ll": (20, 5)},  # 100 rows on 4 ranks: 4 × 5 of the setting 32
    "../recipes/rl_guided_score/run_rl_guided_score.sh": {"ll": (128, 2), "hl": (128, 1)},
    "../recipes/score/run_score.sh": {"ll": (128, 2)},
    "../recipes/value_shaping/run_value_shaping.sh": {"ll": (128, 2), "hl": (128, 1)},
}


def _argv(script: str, tmp_path: Path) -> list[str]:
    record, stub = tmp_path / "argv", tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    env = {**os.environ, "MLMT_PYTHON": str(stub), "ARGV_RECORD": str(record)}
    result = subprocess.run(["bash", str(REPO / "mlmt-configs" / script)], env=env, capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "verl.trainer.main_mlmt"]
    return argv[2:]


def test_every_experiment_script_is_listed():
    assert len(SCRIPTS) >= 9 and "code/HLT_LLT_RR_mbpp.sh" in SCRIPTS and "math/HLT_LLT_RR_1_15.sh" in SCRIPTS
    assert len(RECIPES) >= 9 and "../recipes/archer/run_archer.sh" in RECIPES
    assert sorted(OPTIMIZER_STEPS) == sorted(SCRIPTS + RECIPES)


@pytest.mark.parametrize("script", SCRIPTS + RECIPES)
def test_script_plan_reaches_every_stage_and_completes_each_lr_schedule(script, tmp_path):
    config = compose_config(_argv(script, tmp_path))
    check_config(config)
    refuse_small_mini_batches(config)  # start-up's mini-batch check: the old ArCHer recipe's 43 steps of 3 rows
    rows = TRAIN_ROWS[script.split("/")[0]]
    set_schedule_horizon(config, rows)
    check_stages_reached(config, rows)  # start-up's data-dependent check
    plan = build_plan(config, rows, 500)
    text = render_markdown(plan)
    assert all(stage.reached for stage in plan.stages), text
    assert "NEVER REACHED" not in text and "NOT COMPLETED" not in text, text
    if len(plan.stages) > 1:  # the SCoRe stages: stage II starts where the script says, within the run
        assert plan.stages[-1].first_step == config.mlmt.stages.schedule[-1] <= plan.total_steps, text
        assert plan.stages[-1].alpha > 0, text  # α acts in stage II
    for level in plan.levels.values():
        if level.frozen:
            assert level.updates == 0 and level.lr is None, text
            continue
        assert level.updates > 0 and level.lr.completed and level.lr.horizon == level.updates, text
        assert level.lr.peak == pytest.approx(level.lr.setting), text
        assert level.optimizer_steps_per_update >= 1 and level.mini_batch <= level.mini_batch_setting, text
    trained = {name: (level.mini_batch, level.optimizer_steps_per_update) for name, level in plan.levels.items()
               if not level.frozen}  # fmt: skip
    assert trained == OPTIMIZER_STEPS[script], text
    assert plan.checkpoint_steps[-1] == plan.total_steps, text


# (SCoRe stage id, β on turn 1, turn 2, turn 3) of each stage: the seed's β1 / β2 / β_L / β_H as the run plan put them
# on each turn before the keys were renamed (docs/CONFIG.md)
SCORE_BETAS = [(1, 0.1, 0.0, 0.01), (2, 0.01, 0.0, 0.01)]
PLAN_BETAS = {script: SCORE_BETAS for script in SCRIPTS} | {"math/HLT_LLF_RR_1_1.sh": [(2, 0.0, 0.0, 0.0)]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_sets_the_per_turn_betas_it_always_had(script, tmp_path, caplog):
    argv = _argv(script, tmp_path)
    assert not [arg for arg in argv if arg.split("=")[0].split(".")[-1] in ("beta1", "beta2", "beta_l", "beta_h")]
    with caplog.at_level("WARNING", logger="agent_system.config"):
        config = compose_config(argv)
        check_config(config)
    assert not [record for record in caplog.records if "deprecated" in record.getMessage()]
    plan = build_plan(config, TRAIN_ROWS[script.split("/")[0]], 500)
    betas = [(stage.stage_id, stage.beta_turn1, stage.beta_turn2, stage.beta_turn3) for stage in plan.stages]
    assert betas == PLAN_BETAS[script]


# The scripts' models, as local folders holding only their public config.json (nothing is downloaded), and verl's GPU
# settings in place of the CPU overlay's: the run each script starts on a GPU node, estimated on 80 GiB devices.
LLAMA = {"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "tie_word_embeddings": True, "attention_bias": False}  # fmt: skip
SHAPES = {
    "meta-llama/Llama-3.2-1B-Instruct": {**LLAMA, "hidden_size": 2048, "num_hidden_layers": 16,
                                         "intermediate_size": 8192, "head_dim": 64},
    "meta-llama/Llama-3.2-3B-Instruct": {**LLAMA, "hidden_size": 3072, "num_hidden_layers": 28,
                                         "intermediate_size": 8192, "num_attention_heads": 24, "head_dim": 128},
    "Qwen/Qwen2.5-7B-Instruct": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                                 "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                                 "vocab_size": 152064, "tie_word_embeddings": False},
    "Qwen/Qwen2.5-1.5B-Instruct": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
                                   "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
                                   "vocab_size": 151936, "tie_word_embeddings": True},
}  # fmt: skip
GPU_RUN = [
    f"{tree}.{key}"
    for tree in ("actor_rollout_ref", "hl")
    for key in ("rollout.dtype=bfloat16", "rollout.engine_kwargs.vllm.kv_cache_memory_bytes=null",
                "rollout.free_cache_engine=true", "model.use_remove_padding=true",
                "actor.ppo_max_token_len_per_gpu=16384", "rollout.log_prob_max_token_len_per_gpu=16384",
                "model.enable_gradient_checkpointing=true")
] + [f"++{tree}.actor.fsdp_config.mixed_precision.param_dtype=bf16" for tree in ("actor_rollout_ref", "hl")] + [
    "mlmt.plan_device_gib=80"]  # fmt: skip


def _gpu_config(argv: list[str], tmp_path: Path, script: str):
    """The config of the script's GPU run, its models' folders holding their config.json."""
    folders = {}
    for name, shape in SHAPES.items():
        folders[name] = tmp_path / name.replace("/", "--")
        folders[name].mkdir(exist_ok=True)
        (folders[name] / "config.json").write_text(json.dumps(shape))
    local = [next((f"{arg.split('=')[0]}={folders[v]}" for v in folders if arg.endswith(f"={v}")), arg) for arg in argv]
    config = compose_config([*local, *GPU_RUN])
    check_config(config)
    set_schedule_horizon(config, TRAIN_ROWS[script.split("/")[0]])
    return config


def _gpu_plan(argv: list[str], tmp_path: Path, script: str, flash_attn: bool = True):
    """The plan of the script's GPU run; without ``flash_attn``, after start-up's sdpa fallback and lowering."""
    config = _gpu_config(argv, tmp_path, script)
    rows = TRAIN_ROWS[script.split("/")[0]]
    if not flash_attn:
        attention_fallback(config, on_gpu=True, flash_attn=False)
        lower_padded_budgets(config, build_plan(config, rows, 500).memory)
    return build_plan(config, rows, 500)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "sdpa"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_fits_80_gib_devices_on_its_default_gpus(script, flash_attn, tmp_path):
    plan = _gpu_plan(_argv(script, tmp_path), tmp_path, script, flash_attn)
    assert plan.memory is not None, plan.memory_unavailable
    refuse_overcommit(plan.memory, allowed=False)  # start-up would not refuse it
    assert all(group.fits for group in plan.memory.sums), render_markdown(plan)
    assert all(group.total <= 80 * GIB * (1 - MARGIN) for group in plan.memory.sums)  # the margin kept free


def test_a_1_5b_solver_without_flash_attn_is_lowered_to_keep_the_margin(tmp_path):
    """Qwen2.5-1.5B's 151,936-entry vocabulary on padded rows: its update's logits (65 GiB at 2 × 16,384 tokens)
    beside its state, activations and the processes' overheads exceed 72 of 80 GiB; start-up lowers its budget."""
    script = "math/HLT_LLT_RR_1_15.sh"
    argv = [*_argv(script, tmp_path), "actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct"]
    assert all(group.fits for group in _gpu_plan(argv, tmp_path, script).memory.sums)  # flash-attn: fits as it is
    config = _gpu_config(argv, tmp_path, script)
    attention_fallback(config, on_gpu=True, flash_attn=False)
    before = build_plan(config, TRAIN_ROWS["math"], 500)
    message = next(text for text in overcommit_messages(before.memory) if text.startswith("GPU memory: LL "))
    update = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    assert "LL needs about 85.04 GiB on each of the 2 LL devices (mlmt.ll_gpus) at the peak (LL update)" in message
    assert "of 72.00 GiB usable (80.00 GiB, mlmt.plan_device_gib=80, less a 10 % margin" in message
    assert f"a start-up on a GPU lowers {update} to 13397" in message
    assert f"{update}=13397" in lower_padded_budgets(config, before.memory)
    after = build_plan(config, TRAIN_ROWS["math"], 500)
    refuse_overcommit(after.memory, allowed=False)
    page = render_markdown(after)
    assert "- device: 80.00 GiB (mlmt.plan_device_gib=80); usable 72.00 GiB (a 10 % margin kept free)" in page
    assert "(LL update): LL = 72.00 of 72.00 GiB usable — fits" in page


def test_a_7b_feedback_writer_on_the_default_split_is_refused_at_start_up(tmp_path):
    argv = [*_argv("math/HLT_LLT_RR_1_15.sh", tmp_path), "hl.model.path=Qwen/Qwen2.5-7B-Instruct"]
    plan = _gpu_plan(argv, tmp_path, "math/HLT_LLT_RR_1_15.sh")
    with pytest.raises(ConfigError, match=r"HL needs about 98\.16 GiB on each of the 2 HL devices \(mlmt\.hl_gpus\)"):
        refuse_overcommit(plan.memory, allowed=False)


# The 2 × 8 reproduction (issue 42, point 5), planned on this GPU-less machine for H100 nodes (mlmt.plan_device): the
# scripts take the devices of one node from GPUS_PER_NODE, the plan refuses pools the nodes cannot hold, and a node
# count set to both pools' sum is noticed with the key that fixes it.
QWEN_1_5B = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
REPRODUCTION = {"LL_GPUS": "8", "HL_GPUS": "8", "GPUS_PER_NODE": "8"}


def _planned_on_h100_nodes(tmp_path: Path, monkeypatch, env: dict[str, str], *extra: str):
    for name, shape in (("solver", QWEN_1_5B), ("writer", SHAPES["Qwen/Qwen2.5-7B-Instruct"])):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(shape))
    for key, value in {**env, "LL_MODEL": str(tmp_path / "solver"), "HL_MODEL": str(tmp_path / "writer")}.items():
        monkeypatch.setenv(key, value)
    argv = _argv("math/HLT_LLT_RR_1_15.sh", tmp_path)
    config = compose_config([*argv, "mlmt.plan_only=true", "mlmt.plan_device=h100-80", *extra])
    check_config(config)
    set_schedule_horizon(config, TRAIN_ROWS["math"])
    return config


def test_the_2x8_command_plans_every_device_of_both_nodes(tmp_path, monkeypatch):
    from agent_system.launcher.gpu_checks import check_pools_fit_nodes

    config = _planned_on_h100_nodes(tmp_path, monkeypatch, REPRODUCTION, "trainer.nnodes=2")
    assert config.trainer.n_gpus_per_node == 8 and config.trainer.nnodes == 2
    check_pools_fit_nodes(config, None)  # 8 + 8 on two nodes of 8
    plan = build_plan(config, TRAIN_ROWS["math"], 500)
    assert not [notice for notice in plan.notices if notice.startswith("GPUs:")], plan.notices
    assert all(group.fits for group in plan.memory.sums), render_markdown(plan)


def test_a_node_count_set_to_both_pools_is_noticed_with_the_key_that_fixes_it(tmp_path, monkeypatch):
    env = {key: value for key, value in REPRODUCTION.items() if key != "GPUS_PER_NODE"}  # the former LL + HL per node
    config = _planned_on_h100_nodes(tmp_path, monkeypatch, env, "trainer.nnodes=2")
    assert config.trainer.n_gpus_per_node == 16
    notices = [notice for notice in build_plan(config, TRAIN_ROWS["math"], 500).notices if notice.startswith("GPUs:")]
    assert len(notices) == 1 and "16 stay idle; set trainer.n_gpus_per_node=8 if each node has 8 devices" in notices[0]


def test_pools_larger_than_the_nodes_are_refused_by_the_plan(tmp_path, monkeypatch):
    from agent_system.launcher.gpu_checks import check_pools_fit_nodes

    config = _planned_on_h100_nodes(tmp_path, monkeypatch, REPRODUCTION, "trainer.nnodes=1")
    with pytest.raises(ConfigError, match=r"trainer\.nnodes=1 × trainer\.n_gpus_per_node=8\), each pool on one node: "
                       r"LL pool \(mlmt\.ll_gpus=8\): 8; HL pool \(mlmt\.hl_gpus=8\): 8"):  # fmt: skip
        check_pools_fit_nodes(config, None)
