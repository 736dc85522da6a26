#!/usr/bin/env bash
# HLT_LLF_RR_1_1: train the feedback writer only: the LL is frozen (never updated, synced or saved) and the HL trains
# on every step with REINFORCE on R3 (the original's HLT_LLF_* runs; the other settings as HLT_LLT_RR_1_1). The SCoRe
# stages are left out: every stage coefficient acts on the LL's rewards, which a frozen LL never uses (and
# validate_config rejects β > 0 for a frozen level).
#
#   bash mlmt-configs/math/HLT_LLF_RR_1_1.sh [key=value ...]                         # on a GPU node (2 GPUs per level)
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLT_LLF_RR_1_1.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh plus the overrides below, then your own ("$@", last, so they win). Environment:
# MODEL / LL_MODEL / HL_MODEL, DATA_DIR (or TRAIN_FILES / VAL_FILES), LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON.
# W&B project mlmt_math; outputs in outputs/mlmt_math/HLT_LLF_RR_1_1 (a rerun resumes from the latest checkpoint).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${RR[@]}" "${EARLY[@]}" \
  mlmt.schedule.tH=1 mlmt.schedule.tL=1 \
  mlmt.ll.freeze=true \
  trainer.experiment_name=HLT_LLF_RR_1_1 \
  "$@"
