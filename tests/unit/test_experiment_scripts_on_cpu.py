"""The per-experiment scripts (mlmt-configs/{math,code}/*.sh): each composes a valid config with its run's settings.

Every script is run through bash with MLMT_PYTHON set to a stub that records the argv the script would give
`python -m verl.trainer.main_mlmt`; that argv is composed in-process (Hydra, as the entry point does) and checked
with validate_config. One script also runs for real with Hydra's `--cfg job` appended (the composed config is printed,
nothing runs); that costs ~10 s on this machine (verl's imports), hence not all nine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shared_data import shared_data

from agent_system.config import compose_config
from agent_system.launcher.main import check_config

pytestmark = pytest.mark.external  # runs the bash experiment scripts

REPO = Path(__file__).resolve().parents[2]
LLAMA = "meta-llama/Llama-3.2-1B-Instruct"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODELS = {"math/HLT_LLT_RR_1_10_LoRA.sh": "meta-llama/Llama-3.2-3B-Instruct"}  # script -> its default model

# script -> the key values that make it that run (besides the models and data checked for all)
EXPECTED = {
    "math/HLT_LLT_RR_1_1.sh": {"mlmt.schedule.tH": 1, "mlmt.schedule.tL": 1, "rollout.temperature": 0.1},
    "math/HLT_LLT_RR_1_15.sh": {"mlmt.schedule.tH": 1, "mlmt.schedule.tL": 15, "trainer.total_training_steps": 400},
    "math/HLT_LLT_RR_1_20.sh": {"mlmt.schedule.tH": 1, "mlmt.schedule.tL": 20},
    "math/HLT_LLT_RR_1_10.sh": {"mlmt.schedule.tL": 10, "trainer.total_training_steps": 500},
    "math/HLT_LLT_RR_5_20.sh": {"mlmt.schedule.tH": 5, "mlmt.schedule.tL": 20, "rollout.temperature": 1.0},
    "math/HLF_LLT_RR_1_1.sh": {"mlmt.hl.freeze": True, "mlmt.ll.freeze": False},
    "math/HLT_LLF_RR_1_1.sh": {"mlmt.ll.freeze": True, "mlmt.hl.freeze": False, "mlmt.stages.schedule": [0]},
    "math/HLT_LLT_RR_1_10_LoRA.sh": {
        "mlmt.schedule.tH": 1,
        "mlmt.schedule.tL": 10,
        "trainer.total_training_steps": 500,
        "rollout.temperature": 1.0,
        "data.train_batch_size": 64,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "hl.actor.ppo_mini_batch_size": 64,
        "actor_rollout_ref.actor.optim.lr": 1e-6,
        "hl.actor.optim.lr": 1e-6,
        **{
            f"{tree}.model.{key}": value
            for tree in ("actor_rollout_ref", "hl")
            for key, value in (("lora_rank", 16), ("lora_alpha", 32), ("target_modules", LORA_TARGETS))
        },
    },
    "math/HLT_LLT_GRPO_1_1.sh": {
        "mlmt.ll.adv_estimator": "grpo",
        "mlmt.hl.adv_estimator": "grpo",
        "mlmt.n": 4,
        "mlmt.m": 2,
        "data.train_batch_size": 32,
    },
    "code/HLT_LLT_RR_mbpp.sh": {
        "mlmt.schedule.tH": 1,
        "mlmt.schedule.tL": 5,
        "data.max_prompt_length": 2048,
        "data.max_response_length": 512,
        "hl.rollout.response_length": 512,
        "actor_rollout_ref.actor.optim.lr": 2e-6,
        "rollout.temperature": 0.7,
        "trainer.total_training_steps": 500,
        "trainer.project_name": "mlmt_code",
        "mlmt.stages.schedule": [0, 250],
    },
}
RR = {"mlmt.ll.adv_estimator": "reinforce", "mlmt.hl.adv_estimator": "reinforce", "mlmt.n": 1, "mlmt.m": 1}


def _select(config, key: str):
    from omegaconf import OmegaConf

    if key.startswith("rollout."):  # both levels
        values = {OmegaConf.select(config, f"{name}.{key}") for name in ("actor_rollout_ref", "hl")}
        assert len(values) == 1, (key, values)
        return values.pop()
    value = OmegaConf.select(config, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _expected(script: str) -> dict:
    expected = dict(EXPECTED[script])
    if "GRPO" not in script:
        expected = {**RR, **expected}
    if script.startswith("math/"):
        expected.setdefault("trainer.project_name", "mlmt_math")
        expected.setdefault("data.max_prompt_length", 4096)
        expected.setdefault("data.max_response_length", 1024)
        expected.setdefault("actor_rollout_ref.actor.optim.lr", 5e-7)
        expected.setdefault("hl.actor.optim.lr", 5e-7)
    expected["trainer.experiment_name"] = Path(script).stem
    return expected


def _script_argv(script: str, tmp_path: Path, env: dict | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """The arguments the script passes to `python -m verl.trainer.main_mlmt` (recorded by a stub interpreter)."""
    record = tmp_path / f"{Path(script).stem}.argv"
    stub = tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    run_env = {**os.environ, **(env or {}), "MLMT_PYTHON": str(stub), "ARGV_RECORD": str(record)}
    result = subprocess.run(
        ["bash", str(REPO / "mlmt-configs" / script), *extra], env=run_env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "verl.trainer.main_mlmt"], argv[:2]
    return argv[2:]


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_script_composes_its_run(script, tmp_path, monkeypatch):
    overrides = _script_argv(script, tmp_path)
    config = compose_config(overrides)
    check_config(config)
    assert config.actor_rollout_ref.model.path == config.hl.model.path == MODELS.get(script, LLAMA)
    data = "math" if script.startswith("math/") else "mbpp"
    assert config.data.train_files.startswith(f"data/{data}/")
    for key, value in _expected(script).items():
        assert _select(config, key) == value, (script, key)


def test_environment_and_overrides_win(tmp_path):
    env = {"LL_MODEL": "/models/solver", "HL_MODEL": "/models/writer", "DATA_DIR": "/data"}
    overrides = _script_argv(
        "math/HLT_LLT_RR_1_15.sh", tmp_path, env, ("mlmt.schedule.tL=7", "data.train_batch_size=4")
    )
    config = compose_config(overrides)
    assert config.actor_rollout_ref.model.path == "/models/solver" and config.hl.model.path == "/models/writer"
    assert config.data.train_files == "/data/math/train.parquet"
    assert config.data.val_files == "/data/math/val.parquet"  # held out from MATH-500 (data.prepare)
    assert config.mlmt.schedule.tL == 7 and config.data.train_batch_size == 4  # "$@" comes last


def test_script_with_hydra_cfg_job():
    """The real entry point: `bash SCRIPT --cfg job` prints the composed config (this machine's: the CPU overlay under
    the script's overrides) and exits."""
    script = "math/HLT_LLT_RR_1_15.sh"
    env = {**os.environ, "MLMT_PYTHON": sys.executable, "MODEL": "/models/shared"}
    result = subprocess.run(
        ["bash", str(REPO / "mlmt-configs" / script), "--cfg", "job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["actor_rollout_ref"]["model"]["path"] == printed["hl"]["model"]["path"] == "/models/shared"
    mlmt = printed["mlmt"]
    assert (mlmt["ll"]["adv_estimator"], mlmt["hl"]["adv_estimator"]) == ("reinforce", "reinforce")
    assert (mlmt["n"], mlmt["m"], mlmt["schedule"]["tH"], mlmt["schedule"]["tL"]) == (1, 1, 1, 15)
    assert (mlmt["ll"]["freeze"], mlmt["hl"]["freeze"]) == (False, False)
    assert mlmt["stages"]["schedule"] == [0, 200] and mlmt["stages"]["stage_ids"] == [1, 2]
    assert printed["trainer"]["experiment_name"] == "HLT_LLT_RR_1_15"
    assert printed["trainer"]["project_name"] == "mlmt_math"


# recipe script (relative to the repository) -> the key values that make it that baseline
RECIPES = {
    "recipes/grpo/run_grpo.sh": {
        "mlmt.feedback": "none",
        "mlmt.ll.adv_estimator": "grpo",
        "mlmt.n": 8,
        "data.train_batch_size": 64,
        "trainer.n_gpus_per_node": 4,
        "mlmt.ll_gpus": 4,
    },
    "recipes/score/run_score.sh": {
        "mlmt.feedback": "self",
        "mlmt.ll.adv_estimator": "reinforce",
        "mlmt.stages.schedule": [0, 250],
        "mlmt.stages.beta_turn1": [0.1, 0.01],
        "mlmt.stages.alpha": [0.0, 10.0],
        "mlmt.stages.returns": "score",  # SCoRe's own episode return
        "trainer.total_training_steps": 500,
    },
    "recipes/rl_guided_score/run_rl_guided_score.sh": {
        "mlmt.feedback": "model",
        "mlmt.hl.adv_estimator": "reinforce",
        "mlmt.reward.hl_reward": "r3",
        "hl.actor.use_kl_loss": True,
        "hl.actor.kl_loss_coef": 0.05,
        "hl.actor.kl_loss_type": "low_var_kl",  # k3, as MLMT's per-turn β (k1 = kl would not act)
        "hl.actor.optim.lr": 1e-6,
        "mlmt.stages.schedule": [0, 250],
    },
    "recipes/archer/run_archer.sh": {
        "mlmt.feedback": "none",
        "mlmt.ll.adv_estimator": "archer",
        "mlmt.archer.actor_signal": "advantage",
        "mlmt.archer.target_refresh_every": 10,
        "mlmt.ll_gpus": 3,
        "trainer.n_gpus_per_node": 4,  # the node: 3 solver devices and the critic's
        "trainer.total_training_steps": 500,
    },
}


@pytest.mark.parametrize("script", sorted(RECIPES))
def test_recipe_script_composes_its_baseline(script, tmp_path):
    overrides = _script_argv(f"../{script}", tmp_path)
    config = compose_config(overrides)
    check_config(config)
    assert config.actor_rollout_ref.model.path == LLAMA and config.data.train_files == "data/math/train.parquet"
    assert config.trainer.project_name == "mlmt_baselines"
    assert config.trainer.experiment_name.startswith(Path(script).parent.name)
    for key, value in RECIPES[script].items():
        assert _select(config, key) == value, (script, key)


def test_archer_recipe_variants(tmp_path):
    """recipes/archer: TASK=code runs on MBPP with the code run's lengths; FEEDBACK=self and SIGNAL=q act."""
    script = "../recipes/archer/run_archer.sh"
    config = compose_config(_script_argv(script, tmp_path, {"TASK": "code", "FEEDBACK": "self", "SIGNAL": "q"}))
    check_config(config)
    assert config.data.train_files == "data/mbpp/train.parquet" and config.data.val_files == "data/mbpp/val.parquet"
    assert (config.data.max_prompt_length, config.data.max_response_length) == (2048, 512)
    assert config.mlmt.feedback == "self" and config.mlmt.archer.actor_signal == "q"
    assert config.trainer.experiment_name == "archer_code_self"
    assert config.mlmt.archer.critic_model_path == LLAMA  # the solver's model


@pytest.mark.parametrize("value_grad", ["stop", "full"])
def test_value_shaping_script_composes_each_variant(value_grad, tmp_path):
    """recipes/value_shaping: VALUE_GRAD selects the variant; the rest is the same run."""
    overrides = _script_argv(
        "../recipes/value_shaping/run_value_shaping.sh", tmp_path, {"VALUE_GRAD": value_grad, "VALUE_COEF": "0.3"}
    )
    config = compose_config(overrides)
    check_config(config)
    assert config.actor_rollout_ref.model.path == config.hl.model.path == LLAMA
    assert config.data.train_files == "data/math/train.parquet"
    expected = {
        "mlmt.feedback": "model",
        "mlmt.ll.adv_estimator": "value_baseline",
        "mlmt.hl.adv_estimator": "reinforce",
        "mlmt.reward.hl_reward": "value_shaped",
        "mlmt.value_shaping.value_grad": value_grad,
        "mlmt.value_shaping.value_coef": 0.3,
        "mlmt.value_shaping.symmetric_reward": True,
        "hl.actor.use_kl_loss": True,
        "hl.actor.kl_loss_coef": 0.05,
        "hl.actor.kl_loss_type": "low_var_kl",
        "trainer.project_name": "mlmt_baselines",
        "trainer.experiment_name": f"value_shaping_{value_grad}",
    }
    for key, value in expected.items():
        assert _select(config, key) == value, key


@pytest.mark.parametrize("script", ["rl_guided_score/run_rl_guided_score.sh", "value_shaping/run_value_shaping.sh"])
def test_recipe_kl_loss_pulls_the_guidance_model_toward_its_reference(script, tmp_path):
    """The recipe's KL loss (verl's ``kl_penalty`` with its ``hl.actor.kl_loss_type``), in expectation over the HL's
    own samples of a 3-token policy, has a gradient whose descent lowers KL(π‖π_ref); k1 (``kl``, which these recipes
    used) has a gradient of exactly 0 (tests/unit/trainer/test_kl_estimators_on_cpu.py)."""
    import torch

    from agent_system import verl_compat as vc

    config = compose_config(_script_argv(f"../recipes/{script}", tmp_path))
    assert config.hl.actor.use_kl_loss and config.hl.actor.kl_loss_coef > 0
    log_ref = torch.log_softmax(torch.tensor([0.5, 0.0, -0.5]), -1)

    def kl_and_loss_grad(logits):
        logits = logits.clone().requires_grad_(True)
        log_pi = torch.log_softmax(logits, -1)
        kl = float((log_pi.exp() * (log_pi - log_ref)).sum().detach())
        kld = vc.kl_penalty(logprob=log_pi, ref_logprob=log_ref, kl_penalty=config.hl.actor.kl_loss_type)
        (grad,) = torch.autograd.grad((log_pi.exp().detach() * kld).sum(), logits)
        return kl, grad

    logits = torch.tensor([-1.0, 0.5, 1.5])  # a policy moved away from its reference
    kl, grad = kl_and_loss_grad(logits)
    assert grad.abs().max() > 0.05, grad
    assert kl_and_loss_grad(logits - 0.5 * grad)[0] < kl - 0.01  # one descent step moves toward the reference


@pytest.mark.parametrize(("task", "batch"), [("arith_words", None), ("best_lang", "1")])
def test_custom_yaml_script_composes_its_run(task, batch, tmp_path):
    """recipes/custom_yaml/run_custom_yaml.sh: the task's parquet as train and validation data, GRPO at both levels."""
    env = {"TASK": str(REPO / "recipes" / "custom_yaml" / f"{task}.yaml"), "DATA_DIR": "/data"}
    if batch:
        env["BATCH"] = batch
    config = compose_config(_script_argv("../recipes/custom_yaml/run_custom_yaml.sh", tmp_path, env))
    check_config(config)
    assert config.data.train_files == f"/data/custom_yaml/{task}.parquet"
    assert config.data.val_files == f"/data/custom_yaml/{task}.val.parquet"
    assert config.data.train_batch_size == int(batch or 16)
    assert (config.mlmt.ll.adv_estimator, config.mlmt.hl.adv_estimator, config.mlmt.n, config.mlmt.m) == (
        "grpo", "grpo", 4, 2
    )  # fmt: skip
    assert config.trainer.project_name == "mlmt_custom_yaml" and config.trainer.experiment_name == task
    assert config.actor_rollout_ref.model.path == config.hl.model.path == LLAMA


def test_reinforce_kl_script_composes_the_seed_settings(tmp_path):
    """recipes/reinforce_kl: LLM_RL's settings (kl_coeff 0.25 as the turn-1 β, reference refreshed every 2 steps,
    REINFORCE, one turn) on the 5-shot GSM8K parquet files, a valid config with the LL's reference model."""
    from agent_system.config import reference_needed

    config = compose_config(_script_argv("../recipes/reinforce_kl/run_reinforce_kl.sh", tmp_path))
    check_config(config)
    assert config.actor_rollout_ref.model.path == LLAMA
    assert config.data.train_files == "data/gsm8k_5shot/train.parquet"
    assert config.data.val_files == "data/gsm8k_5shot/val.parquet"
    expected = {
        "mlmt.feedback": "none",
        "mlmt.ll.adv_estimator": "reinforce",
        "mlmt.n": 1,
        "mlmt.stages.beta_turn1": [0.25],
        "mlmt.stages.kl_in": "advantage",  # the seed's KL in the reward
        "mlmt.stages.stage_ids": [2],
        "mlmt.ll.ref_refresh_freq": 2,
        "trainer.experiment_name": "reinforce_kl",
        "trainer.project_name": "mlmt_baselines",
    }
    for key, value in expected.items():
        assert _select(config, key) == value, key
    assert reference_needed(config) == {"ll": True, "hl": False}


@pytest.fixture(scope="module")
def prepared_data(tmp_path_factory) -> Path:
    """The default data files (agent_system.data.prepare on ../shared/data, tests/shared_data.py), ~12 s."""
    from agent_system.data.prepare import prepare_all

    out = tmp_path_factory.mktemp("data")
    prepare_all(str(shared_data()), str(out))
    return out


@pytest.mark.parametrize("script", [*sorted(EXPECTED), *(f"../{s}" for s in sorted(RECIPES))])
def test_each_script_reaches_every_stage_it_declares(script, prepared_data, tmp_path):
    """The run's step count, computed as the trainer does from its default training rows, batch and epochs (or its
    fixed step count), reaches the first step of every stage of mlmt.stages.schedule (the early math scripts ran 3
    epochs = 174 steps and never reached their stage II at step 200)."""
    import pandas as pd

    from agent_system.trainer.advantages import stage_at
    from agent_system.trainer.state import total_training_steps

    config = compose_config(_script_argv(script, tmp_path, {"DATA_DIR": str(prepared_data)}))
    rows = len(pd.read_parquet(config.data.train_files))
    total = total_training_steps(
        config.trainer.total_training_steps, config.trainer.total_epochs, rows, config.data.train_batch_size
    )
    reached = {stage_at(config.mlmt.stages, step)[0] for step in range(1, total + 1)}
    assert reached == set(range(len(config.mlmt.stages.schedule))), (script, total, list(config.mlmt.stages.schedule))
    early = ("HLT_LLT_RR_1_1", "HLT_LLT_RR_1_15", "HLT_LLT_RR_1_20", "HLF_LLT_RR_1_1")
    if script in {f"math/{name}.sh" for name in early}:
        assert list(config.mlmt.stages.schedule) == [0, 200] and total == 400  # stage II: steps 200-400


@pytest.mark.parametrize(
    ("env", "per_node"),
    [({}, 4), ({"LL_GPUS": "8", "HL_GPUS": "8"}, 16), ({"LL_GPUS": "8", "HL_GPUS": "8", "GPUS_PER_NODE": "8"}, 8)],
)
def test_scripts_take_the_devices_of_one_node_from_gpus_per_node(env, per_node, tmp_path):
    """trainer.n_gpus_per_node counts one node's devices: GPUS_PER_NODE, else both pools on one node (issue 42, 5)."""
    config = compose_config(_script_argv("math/HLT_LLT_RR_1_15.sh", tmp_path, env))
    assert config.trainer.n_gpus_per_node == per_node
    assert (config.mlmt.ll_gpus, config.mlmt.hl_gpus) == (int(env.get("LL_GPUS", 2)), int(env.get("HL_GPUS", 2)))
    baseline = compose_config(_script_argv("../recipes/grpo/run_grpo.sh", tmp_path, {"GPUS": "4", **env}))
    assert baseline.trainer.n_gpus_per_node == (8 if "GPUS_PER_NODE" in env else 4)
