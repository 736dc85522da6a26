#!/usr/bin/env bash
# HLF_LLT_RR_1_1: fixed feedback: the HL is frozen (never updated, synced or saved) and writes feedback with
# its initial weights; the LL trains on every step with REINFORCE (the original's HLF_* runs, the paper's "fixed
# feedback" baseline; the other settings as HLT_LLT_RR_1_1).
#
#   bash mlmt-configs/math/HLF_LLT_RR_1_1.sh [key=value ...]                         # a GPU node, 2 GPUs per level
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLF_LLT_RR_1_1.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh (models, data, the paper's math hyper-parameters, the SCoRe stages) plus the
# overrides below, then your own ("$@", last, so they win). Environment: MODEL / LL_MODEL / HL_MODEL, DATA_DIR (or
# TRAIN_FILES / VAL_FILES), LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_math; outputs in
# outputs/mlmt_math/HLF_LLT_RR_1_1 (a rerun resumes from the latest checkpoint).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${MATH_STAGES[@]}" \
  "${RR[@]}" "${EARLY[@]}" \
  mlmt.schedule.tH=1 mlmt.schedule.tL=1 \
  mlmt.hl.freeze=true \
  trainer.experiment_name=HLF_LLT_RR_1_1 \
  "$@"
