#!/usr/bin/env bash
# MLMT on a task defined in YAML (recurve's format, seed 003): converts the task file to verl parquet, then trains the
# solver and the feedback writer on it with the project's trainer. Rows are graded by the task's own score_fn (run in
# the sandbox), up to where its done_fn ends the episode; the solver reads the task's main_prompt + item prompt as is.
# GRPO at both levels (n = 4 attempts, m = 2 feedbacks), the math runs' hyper-parameters (experiment_common.sh).
#
#   bash recipes/custom_yaml/run_custom_yaml.sh [key=value ...]                             # a GPU node, arith_words
#   TASK=recipes/custom_yaml/best_lang.yaml BATCH=1 bash recipes/custom_yaml/run_custom_yaml.sh   # recurve's example
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/custom_yaml/run_custom_yaml.sh      # on Slurm
#
# Environment: TASK (the task file, default recipes/custom_yaml/arith_words.yaml), VAL_TASK (validation task file,
# default TASK), BATCH (problems per step, default 16; at most the task's item count), STEPS (default 200), DATA_DIR
# (the parquet goes to $DATA_DIR/custom_yaml/<task>.parquet), MODEL / LL_MODEL / HL_MODEL, LL_GPUS / HL_GPUS, LOGGER,
# MLMT_PYTHON. W&B project mlmt_custom_yaml, experiment = the task's name; outputs in
# outputs/mlmt_custom_yaml/<task> (a rerun resumes).
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
TASK=${TASK:-$HERE/arith_words.yaml}
VAL_TASK=${VAL_TASK:-$TASK}
NAME=$(basename "${TASK%.*}")
DATA_DIR=${DATA_DIR:-data}
TRAIN_FILES=$DATA_DIR/custom_yaml/$NAME.parquet
VAL_FILES=$DATA_DIR/custom_yaml/$(basename "${VAL_TASK%.*}").val.parquet
source "$HERE/../../mlmt-configs/experiment_common.sh"
set -x

"$MLMT_PYTHON" -m agent_system.data.preprocess --dataset yaml --input "$TASK" --output "$TRAIN_FILES"
"$MLMT_PYTHON" -m agent_system.data.preprocess --dataset yaml --input "$VAL_TASK" --split test --output "$VAL_FILES"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${LATER[@]}" \
  mlmt.ll.adv_estimator=grpo mlmt.hl.adv_estimator=grpo mlmt.n=4 mlmt.m=2 \
  data.train_batch_size="${BATCH:-16}" trainer.total_training_steps="${STEPS:-200}" \
  trainer.project_name=mlmt_custom_yaml trainer.experiment_name="$NAME" \
  "$@"
