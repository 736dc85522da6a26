#!/usr/bin/env bash
# HLT_LLT_GRPO_1_1: not an original run: this project's GRPO variant (the MLMT row of recipes/compare.sh; the headline
# run, the paper's, is HLT_LLT_RR_1_10.sh: docs/REPRODUCING.md). Both levels trainable and updated on
# every step, with group baselines the original never had (its n > 1 path was broken: docs/METHOD.md, "Where this
# differs from the original"): n = 4 attempts per problem (turn-1 GRPO groups of 4), m = 2 feedbacks per attempt (HL
# groups of 2), and all n·m = 8 refinements of a problem as one turn-3 group. 32 problems per step keep the generations
# per step (32·(4 + 8 + 8) = 640) near the RR runs' 384 while every group has a reward spread to learn from. Sampling at
# temperature 1.0 (a group needs diverse samples), 500 steps, the paper's lengths, lr and stages otherwise.
#
#   bash mlmt-configs/math/HLT_LLT_GRPO_1_1.sh [key=value ...]                         # on a GPU node
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLT_LLT_GRPO_1_1.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh plus the overrides below, then your own ("$@", last, so they win). Environment:
# MODEL / LL_MODEL / HL_MODEL, DATA_DIR (or TRAIN_FILES / VAL_FILES), LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON.
# W&B project mlmt_math; outputs in outputs/mlmt_math/HLT_LLT_GRPO_1_1 (a rerun resumes from the latest checkpoint).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${MATH_STAGES[@]}" "${LATER[@]}" \
  mlmt.ll.adv_estimator=grpo mlmt.hl.adv_estimator=grpo \
  mlmt.n=4 mlmt.m=2 mlmt.ll.turn3_group_by=problem \
  data.train_batch_size=32 \
  mlmt.schedule.tH=1 mlmt.schedule.tL=1 \
  trainer.experiment_name=HLT_LLT_GRPO_1_1 \
  "$@"
