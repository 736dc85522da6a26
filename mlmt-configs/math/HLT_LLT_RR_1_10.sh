#!/usr/bin/env bash
# HLT_LLT_RR_1_10: both levels trainable, REINFORCE at both; cycles of 10 LL steps then 1 HL step (the original's later
# HLT_LLT_RR_1_10 scripts, the typical math run of docs/METHOD.md, "The original's runs": temperature 1.0, 500 steps).
# Its "_1_10_5" sibling adds the contrastive HL reward: mlmt.reward.hl_reward=contrastive
# mlmt.reward.contrastive_lambda=1.0 mlmt.reward.reg_gap=5.
#
#   bash mlmt-configs/math/HLT_LLT_RR_1_10.sh [key=value ...]                         # a GPU node, 2 GPUs per level
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLT_LLT_RR_1_10.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh (models, data, the paper's math hyper-parameters, the SCoRe stages) plus the
# overrides below, then your own ("$@", last, so they win). Environment: MODEL / LL_MODEL / HL_MODEL, DATA_DIR (or
# TRAIN_FILES / VAL_FILES), LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_math; outputs in
# outputs/mlmt_math/HLT_LLT_RR_1_10 (a rerun resumes from the latest checkpoint).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${MATH_STAGES[@]}" \
  "${RR[@]}" "${LATER[@]}" \
  mlmt.schedule.tH=1 mlmt.schedule.tL=10 \
  trainer.experiment_name=HLT_LLT_RR_1_10 \
  "$@"
