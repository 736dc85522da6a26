"""The pre-flight run plan (agent_system/launcher/plan.py): what each level gets, computed before any worker starts,
and its comparison with a run's step records."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config, set_schedule_horizon
from agent_system.launcher.memory_estimate import CUDA_CONTEXT
from agent_system.launcher.plan import (
    PlanMismatch,
    build_plan,
    check_run,
    compress_steps,
    plan_differences,
    read_plan,
    render_markdown,
    write_plan,
)

REPO = Path(__file__).resolve().parents[3]


def _plan(overrides, train_rows=10_000, val_rows=8):
    config = compose_config(overrides)
    set_schedule_horizon(config, train_rows)
    return config, build_plan(config, train_rows, val_rows)


def test_compress_steps():
    assert compress_steps([]) == "none"
    assert compress_steps([1, 2, 3, 5, 7, 8, 9]) == "1-3, 5, 7-9"
    assert compress_steps(list(range(15, 501, 16))) == "15, 31, …, 495 (every 16)"
    ll = [s for s in range(1, 501) if s % 16 != 15]
    assert compress_steps(ll) == "1-14, 16-30, 32-46, …, 480-494 (every 16), 496-500"


def test_rr_1_15_plan_gives_each_levels_updates_and_lr():
    cosine = [f"{tree}.optim.{key}" for tree in ("actor_rollout_ref.actor", "hl.actor")
              for key in ("lr_scheduler_type=cosine", "lr_warmup_steps_ratio=0.1")]  # fmt: skip
    every_50 = ["trainer.save_freq=50", "trainer.test_freq=50"]
    config, plan = _plan(["trainer.total_training_steps=500", "mlmt.schedule.tL=15", *every_50, *cosine])
    ll, hl = plan.levels["ll"], plan.levels["hl"]
    assert (ll.updates, hl.updates) == (469, 31)
    assert hl.update_steps_text == "15, 31, …, 495 (every 16)"
    for level in (ll, hl):
        lr = level.lr
        assert lr.completed and lr.horizon == level.updates and lr.peak == pytest.approx(lr.setting)
        assert lr.first == 0.0 and lr.peak_update == int(0.1 * level.updates) + 1 and lr.after_last == 0.0
    assert plan.total_steps == 500 and plan.checkpoint_steps == list(range(50, 501, 50))
    assert plan.validation_steps == [0, *range(50, 501, 50)]


def test_rows_tokens_samples_and_references():
    config, plan = _plan(["mlmt.n=4", "mlmt.m=2", "data.train_batch_size=8", "mlmt.reward.hl_reward=contrastive",
                          "mlmt.stages.beta_turn3=[0.01]", "mlmt.hl.adv_estimator=gae"])  # fmt: skip
    ll, hl = plan.levels["ll"], plan.levels["hl"]
    assert ll.rows_per_update == 8 * 4 * 3 and hl.rows_per_update == 8 * 4 * 2
    assert ll.tokens_per_row == config.data.max_prompt_length + config.data.max_response_length
    assert hl.tokens_per_step == 64 * (config.data.max_prompt_length + config.hl.rollout.response_length)
    # LL: 32 attempts + 64 refinements + 64 lagged-snapshot refinements (contrastive); HL: 64 feedbacks
    assert (ll.samples_per_step, hl.samples_per_step, plan.samples_per_step) == (160, 64, 224)
    assert ll.reference.startswith("initial weights") and hl.reference.startswith("none")
    assert (ll.critic, hl.critic) == ("none", "hl_critic") and hl.critic_lr.horizon == hl.updates
    assert plan.samples_per_validation == 8 * 3


def test_stage_periods_with_their_coefficients():
    stages = ["mlmt.stages.schedule=[0,200]", "mlmt.stages.stage_ids=[1,2]", "mlmt.stages.beta_turn1=[0.1,0.01]",
              "mlmt.stages.beta_turn3=[0.01,0.02]", "mlmt.stages.beta_turn2=[0,0]",
              "mlmt.stages.alpha=[0,10]", "trainer.total_training_steps=400"]  # fmt: skip
    _, plan = _plan(stages)
    first, second = plan.stages
    assert (first.first_step, first.last_step, second.first_step, second.last_step) == (1, 199, 200, 400)
    assert (first.beta_turn1, first.turn1_task_reward, first.alpha) == (0.1, False, 0.0)
    assert (second.beta_turn1, second.beta_turn3, second.alpha, second.turn1_task_reward) == (0.01, 0.02, 10.0, True)
    assert plan.stage_index_at(199) == 0 and plan.stage_index_at(200) == 1
    assert "steps 200-400" in render_markdown(plan)


@pytest.mark.parametrize(
    ("overrides", "key", "size", "steps"),
    [
        # recipes/reinforce_kl: 100 rows, mini-batches of "32" are 25 rows
        (["mlmt.feedback=none", "mlmt.n=1", "data.train_batch_size=100", "mlmt.ll.adv_estimator=reinforce",
          "actor_rollout_ref.actor.ppo_mini_batch_size=32"], "actor_rollout_ref.actor.ppo_mini_batch_size=32", 25, 4),
        # 17 rows: a prime, 17 one-row optimizer steps (refused unless allowed: below)
        (["mlmt.feedback=none", "mlmt.n=1", "data.train_batch_size=17", "mlmt.ll.adv_estimator=reinforce",
          "actor_rollout_ref.actor.ppo_mini_batch_size=16", "mlmt.allow_small_mini_batches=true"],
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", 1, 17),
    ],
)  # fmt: skip
def test_mini_batch_cut_to_a_divisor_is_said_at_start_up(overrides, key, size, steps):
    config, plan = _plan(overrides)
    check_config(config)
    ll = plan.levels["ll"]
    assert (ll.mini_batch, ll.optimizer_steps_per_update) == (size, steps)
    (notice,) = plan.notices
    assert notice.startswith(key) and f"mini-batches of {size} rows" in notice and f"{steps} optimizer steps" in notice


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        # recipes/archer before issue 34: 128 rows on 3 ranks, padded to 129, cut into 43 mini-batches of 3 rows
        (["mlmt.feedback=none", "mlmt.n=1", "mlmt.m=1", "data.train_batch_size=128", "mlmt.ll_gpus=3",
          "trainer.n_gpus_per_node=3", "mlmt.ll.adv_estimator=reinforce",
          "actor_rollout_ref.actor.ppo_mini_batch_size=128"],
         ["129 rows", "3 data-parallel ranks", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
          "effective mini-batch is 3 rows", "43 optimizer steps"]),
        (["mlmt.feedback=none", "mlmt.n=1", "data.train_batch_size=17", "mlmt.ll.adv_estimator=reinforce",
          "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
         ["17 rows", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "effective mini-batch is 1 rows"]),
        # the HL's 17 × 2 × 2 = 68 rows with a mini-batch of 16: 4 rows per step (17 steps); the LL's too
        (["data.train_batch_size=17", "mlmt.m=2", "hl.actor.ppo_mini_batch_size=16"],
         ["hl.actor.ppo_mini_batch_size=16", "effective mini-batch is 4 rows"]),
    ],
)  # fmt: skip
def test_mini_batch_cut_below_half_its_setting_is_refused_unless_allowed(overrides, named):
    from agent_system.launcher.plan import refuse_small_mini_batches

    config = compose_config(overrides)
    check_config(config)  # the other checks pass: the mini-batch check is the plan's (run by main.prepare_config)
    with pytest.raises(ConfigError, match="mlmt.allow_small_mini_batches=true") as error:
        refuse_small_mini_batches(config)
    assert all(text in str(error.value) for text in named), str(error.value)
    refuse_small_mini_batches(compose_config([*overrides, "mlmt.allow_small_mini_batches=true"]))


def test_no_notice_when_the_setting_divides_the_rows():
    _, plan = _plan(["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                     "hl.actor.ppo_mini_batch_size=64"])  # fmt: skip
    assert plan.notices == [] and plan.levels["ll"].mini_batch == 64 and plan.levels["hl"].mini_batch == 64


# Llama-3.2-1B's public config.json values
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "tie_word_embeddings": True}  # fmt: skip
P1B = 1_235_814_400


def test_the_plan_gives_each_devices_gpu_memory_and_warns_when_it_does_not_fit(tmp_path):
    model = tmp_path / "llama-3.2-1b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_1B))
    gpu_like = [f"{tree}.rollout.{key}" for tree in ("actor_rollout_ref", "hl")
                for key in ("dtype=bfloat16", "engine_kwargs.vllm.kv_cache_memory_bytes=null",
                            "gpu_memory_utilization=0.25", f"max_model_len={768 + 1024}")]  # fmt: skip
    overrides = [f"actor_rollout_ref.model.path={model}", f"hl.model.path={model}", "mlmt.placement=colocated",
                 "hl.rollout.response_length=1024", "data.max_response_length=1024", *gpu_like]  # fmt: skip
    config, plan = _plan([*overrides, "trainer.n_gpus_per_node=1", "mlmt.plan_device_gib=141"])
    (shared,) = plan.memory.sums
    # one shared 141 GiB device, the CPU overlay's settings (vLLM awake throughout, padded sequences, fp32 compute, no
    # entropy bonus, no gradient checkpointing, 768 + 1024-token micro-batches): the peak is the LL's update, with both
    # fp32 actors' parameters and moments (12 bytes a parameter each), the LL's gradients (4), the logits of a padded
    # micro-batch (2 × 1,792 tokens × 128,256 × 5 copies × 4 bytes), its activations (every layer's fp32 tensors:
    # norms, query, keys and values repeated to 32 heads, output, the 1,792-token mask row, log-sum-exp, MLP; and the
    # final norm), both vLLM shares of 0.25 × 141 GiB and three processes' CUDA contexts (one rank: no NCCL)
    logits = 2 * 1792 * 128_256 * 5 * 4
    layer = 2 * (12 * 2048 + 4) + 4 * (4 * 2048 + 1792) + 4 * 32 + 4 * 4 * 8192
    activations = 2 * 1792 * (16 * layer + 12 * 2048 + 4)
    vllm = int(0.25 * 141 * 2**30)
    fixed = 2 * 12 * P1B + 4 * P1B + logits + activations + 3 * CUDA_CONTEXT
    peak = fixed + 2 * vllm
    assert shared.levels == ["ll", "hl"] and shared.peak == "LL update" and shared.total == peak and shared.fits
    assert plan.levels["ll"].reference.startswith("none")
    assert plan.memory.levels["ll"].kv_sequences == (vllm - 2 * P1B) // 32_768 // 1792 == 602
    page = render_markdown(plan)
    assert "## GPU memory per device" in page and "141.00 GiB (mlmt.plan_device_gib=141); usable 126.90 GiB" in page
    assert f"(LL update): LL + HL = {peak / 2**30:.2f} of 126.90 GiB usable — fits" in page
    write_plan(plan, tmp_path / "run")
    saved = read_plan(tmp_path / "run")["memory"]
    assert saved["device"] == 141 * 2**30 and saved["sums"][0]["total"] == shared.total
    assert saved["levels"]["hl"]["actor_optimizer"] == 8 * P1B and not plan.notices

    config.mlmt.plan_device_gib = 80  # the same on one 80 GiB device does not fit
    small = build_plan(config, 10_000, 8)
    small_peak = fixed + 2 * int(0.25 * 80 * 2**30)
    assert small.memory.sums[0].total == small_peak and small.memory.sums[0].fits is False
    assert f"{small_peak / 2**30:.2f} of 72.00 GiB usable — DOES NOT FIT" in render_markdown(small)
    (notice,) = small.notices
    assert notice.startswith(f"GPU memory: LL + HL need about {small_peak / 2**30:.2f} GiB on each of the 1 shared")

    config.mlmt.plan_device_gib = None  # on CPU: the device's size is not known here
    unknown = render_markdown(build_plan(config, 10_000, 8))
    assert "- device: not known here (no GPU; set mlmt.plan_device=<name> or mlmt.plan_device_gib=<GiB>" in unknown
    assert f"+ 0.5 × device; fits a device of at least {fixed / (0.9 - 0.5) / 2**30:.2f} GiB" in unknown


def test_without_a_model_config_the_plan_says_why_there_is_no_memory_estimate():
    _, plan = _plan([])  # the embedded model's name, resolved to a folder only at start-up
    assert plan.memory is None and "actor_rollout_ref.model.path=smollm2: no config.json" in plan.memory_unavailable
    assert "- not estimated: actor_rollout_ref.model.path=smollm2" in render_markdown(plan)


def _history(config, plan, last_step):
    """Step records as the trainer writes them, for the run the plan describes (lr as verl reports it)."""
    from agent_system.launcher.plan import lr_after

    records, counts = [], {"ll": 0, "hl": 0}
    for step in range(1, last_step + 1):
        record = {"step": step, "train/stage_index": plan.stage_index_at(step)}
        for level, level_plan in plan.levels.items():
            if step in level_plan.update_steps:
                counts[level] += 1
                record[f"{level}/updated"] = 1.0
                record[f"{level}/lr"] = lr_after(config, level_plan.lr.section, counts[level])
        records.append(record)
    return records


def test_plan_check_names_each_difference(tmp_path):
    overrides = ["trainer.total_training_steps=12", "mlmt.schedule.tL=3", "mlmt.stages.schedule=[0,5]",
                 "mlmt.stages.stage_ids=[2,2]", *[f"mlmt.stages.{k}=[0,0]" for k in
                                                  ("beta_turn1", "beta_turn2", "beta_turn3", "alpha")],
                 "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"]  # fmt: skip
    config, plan = _plan(overrides)
    history = _history(config, plan, 12)
    check_run(plan, config, history, 12)
    check_run(plan, config, history[:7], 7)  # stopped early: the steps that ran
    assert plan_differences(plan, config, history[:7], 12)  # ... but not as a finished run

    moved = copy.deepcopy(history)  # the HL updated at step 4 instead of 3 (the former phase)
    moved[2].pop("hl/updated"), moved[2].pop("hl/lr")
    moved[3]["hl/updated"], moved[3]["hl/lr"] = 1.0, history[2]["hl/lr"]
    assert any(d.startswith("hl: planned 3 updates (3, 7, 11)") for d in plan_differences(plan, config, moved, 12))

    stage = copy.deepcopy(history)
    stage[5]["train/stage_index"] = 0
    assert plan_differences(plan, config, stage, 12) == ["stages: steps 6 ran another stage than the plan's"]

    lr = copy.deepcopy(history)
    lr[-1]["ll/lr"] *= 1.5 if lr[-1]["ll/lr"] else 0.0
    lr[-1]["ll/lr"] += 1e-7
    with pytest.raises(PlanMismatch, match="actor_rollout_ref.actor.optim lr after the last update"):
        check_run(plan, config, lr, 12)

    # resumed from a checkpoint written before run plans: its steps carry no stage / update records
    old = [{"step": r["step"], **({"ll/lr": r["ll/lr"]} if "ll/lr" in r else {})} for r in history[:6]]
    check_run(plan, config, old + history[6:], 12)
    late = old + copy.deepcopy(history[6:])  # ... the steps after it are still checked
    late[-2].pop("hl/updated")  # step 11
    assert any(d.startswith("hl: planned 2 updates (7, 11)") for d in plan_differences(plan, config, late, 12))

    write_plan(plan, tmp_path)
    saved = read_plan(tmp_path)
    assert saved["levels"]["hl"]["update_steps"] == [3, 7, 11] and (tmp_path / "run_plan.md").is_file()


@pytest.mark.external
def test_plan_only_prints_the_plan_and_exits_without_ray(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "verl.trainer.main_mlmt", "mlmt.plan_only=true",
               f"trainer.default_local_dir={out}", "mlmt.schedule.tL=3", "trainer.total_training_steps=9",
               "mlmt.plan_device_gib=80"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "# Run plan" in log and "updated on 2 steps: 3, 7" in log  # the HL under (1, 3)
    assert "Ray:" not in log  # run_mlmt logs the Ray cluster once it started one
    assert read_plan(out)["levels"]["ll"]["updates"] == 7
    memory = read_plan(out)["memory"]  # the embedded SmolLM2-135M on an 80 GiB device (the given size)
    assert memory["device"] == 80 * 2**30 and memory["levels"]["ll"]["parameters"] == 134_515_008
    assert "## GPU memory per device" in log and "80.00 GiB (mlmt.plan_device_gib=80)" in log


def test_a_critic_s_mini_batch_cut_is_read_from_its_own_level():
    """The HL critic's ppo_mini_batch_size defaults to its level's actor's, which in the full config names the LL's
    (actor_rollout_ref): read in the HL's own view, its 40 rows at 32 are cut to 20 (was: read as the LL's 64, no
    cut reported)."""
    from agent_system.launcher.plan import mini_batch_cuts

    overrides = ["mlmt.n=4", "mlmt.m=1", "mlmt.hl.adv_estimator=gae", "mlmt.ll.adv_estimator=reinforce"]
    overrides += ["actor_rollout_ref.actor.ppo_mini_batch_size=64", "hl.actor.ppo_mini_batch_size=32"]
    cuts = {cut.key: cut for cut in mini_batch_cuts(compose_config([*overrides, "data.train_batch_size=10"]))}
    critic = cuts["hl_critic.ppo_mini_batch_size"]
    assert (critic.setting, critic.size, critic.rows) == (32, 20, 40)
