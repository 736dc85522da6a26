#!/usr/bin/env bash
# HLT_LLT_RR_5_20: both levels trainable, REINFORCE at both; cycles of 20 LL steps then 5 HL steps (the
# original's HLT_LLT_RR_5_20: temperature 1.0, 500 steps).
#
#   bash mlmt-configs/math/HLT_LLT_RR_5_20.sh [key=value ...]                         # a GPU node, 2 GPUs per level
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLT_LLT_RR_5_20.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh (models, data, the paper's math hyper-parameters, the SCoRe stages) plus the
# overrides below, then your own ("$@", last, so they win). Environment: MODEL / LL_MODEL / HL_MODEL, DATA_DIR (or
# TRAIN_FILES / VAL_FILES), LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_math; outputs in
# outputs/mlmt_math/HLT_LLT_RR_5_20 (a rerun resumes from the latest checkpoint).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${MATH_STAGES[@]}" \
  "${RR[@]}" "${LATER[@]}" \
  mlmt.schedule.tH=5 mlmt.schedule.tL=20 \
  trainer.experiment_name=HLT_LLT_RR_5_20 \
  "$@"
