#!/usr/bin/env bash
# Single-turn GRPO, like-for-like with MLMT's turn 1: the same solve prompt, data, math-verify reward, lengths and
# hyper-parameters as the math experiments (mlmt-configs/experiment_common.sh), one model, no feedback turn
# (mlmt.feedback=none: no HL workers are started). GRPO groups are the n = 8 attempts on one problem.
#
#   bash recipes/grpo/run_grpo.sh [key=value ...]                       # a GPU node (GPUS=4 devices for the solver)
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/grpo/run_grpo.sh  # on Slurm
#
# Environment: MODEL (default meta-llama/Llama-3.2-1B-Instruct), DATA_DIR (or TRAIN_FILES / VAL_FILES), GPUS,
# LOGGER, MLMT_PYTHON. W&B project mlmt_baselines; outputs in outputs/mlmt_baselines/grpo (a rerun resumes).
# Evaluate: bash mlmt-configs/math/eval_math500.sh outputs/mlmt_baselines/grpo/export/global_step_N/ll
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"

mlmt_run "${SOLVER_ONLY[@]}" "${MATH[@]}" "${LATER[@]}" \
  mlmt.feedback=none \
  mlmt.ll.adv_estimator=grpo mlmt.n=8 data.train_batch_size=64 \
  trainer.project_name=mlmt_baselines trainer.experiment_name=grpo \
  "$@"
