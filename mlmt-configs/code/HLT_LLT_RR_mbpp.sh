#!/usr/bin/env bash
# HLT_LLT_RR_mbpp: the original's code run (docs/METHOD.md, "The original's runs"): MBPP, both levels trainable,
# REINFORCE at both, cycles of 5 LL steps then 1 HL step, prompt 2048 / response 512 tokens (HL too), lr 2e-6,
# temperature 0.7, 500 steps, 128 problems per step, and its SCoRe stages (stage I for 250 steps with β 0.1 on turn 1
# and 0.01 on turn 3, then stage II with β 0.01 on turns 1 and 3, α 10). Differences, stated: the original also set
# score_mode.enable=true, which replaced the three-turn loop by SCoRe's two-turn self-correction and crashed on the
# code feedback prompt (docs/METHOD.md, "Where this differs from the original"); this runs the MLMT loop. Tests run in the project's sandbox (pass/fail
# reward). MBPP rows get the code prompts: the solver writes a function in a ```python block, the feedback writer (a
# programming mentor, no code) reads the attempt's execution result (docs/METHOD.md, "Turns and rewards").
#
#   bash mlmt-configs/code/HLT_LLT_RR_mbpp.sh [key=value ...]                           # on a GPU node
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/code/HLT_LLT_RR_mbpp.sh     # on Slurm
#
# Data: `bash examples/data_preprocess/prepare_all.sh` writes data/mbpp/train.parquet (task_ids 601-974), val.parquet
# (511-600, the validation set) and test.parquet (11-510, evaluate on it); or set TRAIN_FILES / VAL_FILES.
# Runs `python -m verl.trainer.main_mlmt`
# (printing the full command first) with the shared settings of mlmt-configs/experiment_common.sh plus the overrides
# below, then your own ("$@", last, so they win). Environment: MODEL / LL_MODEL / HL_MODEL, DATA_DIR, LL_GPUS /
# HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_code; outputs in outputs/mlmt_code/HLT_LLT_RR_mbpp.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${RR[@]}" \
  data.train_files="${TRAIN_FILES:-$DATA_DIR/mbpp/train.parquet}" \
  data.val_files="${VAL_FILES:-$DATA_DIR/mbpp/val.parquet}" \
  data.train_batch_size=128 \
  data.max_prompt_length=2048 data.max_response_length=512 hl.rollout.response_length=512 \
  actor_rollout_ref.actor.optim.lr=2e-6 hl.actor.optim.lr=2e-6 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant hl.actor.optim.lr_scheduler_type=constant \
  actor_rollout_ref.actor.entropy_coeff=0.001 hl.actor.entropy_coeff=0.001 \
  actor_rollout_ref.actor.ppo_mini_batch_size=128 hl.actor.ppo_mini_batch_size=128 \
  actor_rollout_ref.rollout.temperature=0.7 hl.rollout.temperature=0.7 \
  mlmt.stages.schedule=[0,250] mlmt.stages.stage_ids=[1,2] \
  mlmt.stages.beta_turn1=[0.1,0.01] mlmt.stages.beta_turn2=[0.0,0.0] mlmt.stages.beta_turn3=[0.01,0.01] \
  mlmt.stages.alpha=[0.0,10.0] \
  mlmt.schedule.tH=1 mlmt.schedule.tL=5 \
  trainer.total_training_steps=500 trainer.total_epochs=999 trainer.save_freq=50 \
  trainer.project_name=mlmt_code \
  trainer.experiment_name=HLT_LLT_RR_mbpp \
  "$@"
