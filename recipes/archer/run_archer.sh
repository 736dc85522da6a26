#!/usr/bin/env bash
# ArCHer (Zhou et al., 2024), as recurve and hrl-reasoning's ArCHer baseline run it: an utterance-level critic
# (Q(s, a), V(s), a target copy refreshed by a hard copy every 10 critic updates, trained off-policy from a replay
# buffer with TD targets) and the solver as a token-level actor trained by verl's PPO with the critic's Q − V of each
# utterance on every one of its tokens (mlmt.ll.adv_estimator=archer; agent_system/methods/archer/critic.py).
# One model (no feedback writer); the critic's backbone starts from the solver's weights.
#
#   bash recipes/archer/run_archer.sh [key=value ...]                         # a GPU node: GPUS=4 devices, 3 for
#                                                                             # the solver, 1 for the critic's actor
#   FEEDBACK=self bash recipes/archer/run_archer.sh                           # multi-turn: attempt + self-correction
#   TASK=code bash recipes/archer/run_archer.sh                               # MBPP instead of MATH
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/archer/run_archer.sh  # on Slurm
#
# Environment: TASK (math | code, default math), FEEDBACK (none = single turn, hrl-reasoning's setting, the default;
# self = two solver turns, s2 = the self-correction prompt; model needs an HL: add hl.* overrides), SIGNAL
# (advantage = Q − V, the paper, default | q = Q, recurve), MODEL, DATA_DIR (or TRAIN_FILES / VAL_FILES), GPUS,
# LOGGER, MLMT_PYTHON. W&B project mlmt_baselines; outputs in outputs/mlmt_baselines/archer_<task>_<feedback>.
# Evaluate: bash mlmt-configs/math/eval_math500.sh outputs/mlmt_baselines/archer_math_none/export/global_step_N/ll
set -xeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"

TASK=${TASK:-math}
FEEDBACK=${FEEDBACK:-none}
SIGNAL=${SIGNAL:-advantage}
SOLVER_GPUS=$(( ${GPUS:-4} - 1 ))  # one device for the critic's Ray actor
# Problems per step: the largest multiple of the solver's ranks <= 128 (126 on 3), so that the rows divide evenly over
# the ranks and ppo_mini_batch_size=128 makes one optimizer step per turn, as the other baselines (128 rows on 3 ranks
# were padded to 129 and cut into 43 mini-batches of 3 rows)
PROBLEMS=$(( 128 / SOLVER_GPUS * SOLVER_GPUS ))

case "$TASK" in
  math) TASK_ARGS=("${MATH[@]}") ;;
  code) TASK_ARGS=(  # the MBPP run's settings (mlmt-configs/code/HLT_LLT_RR_mbpp.sh) for the solver
    "${MATH[@]}"
    data.train_files="${TRAIN_FILES:-$DATA_DIR/mbpp/train.parquet}"
    data.val_files="${VAL_FILES:-$DATA_DIR/mbpp/val.parquet}"
    data.max_prompt_length=2048 data.max_response_length=512
    actor_rollout_ref.actor.optim.lr=2e-6 actor_rollout_ref.rollout.temperature=0.7
  ) ;;
  *) echo "TASK=$TASK: choose math or code" >&2; exit 2 ;;
esac

mlmt_run "${SOLVER_ONLY[@]}" "${LATER[@]}" "${TASK_ARGS[@]}" \
  mlmt.ll_gpus="$SOLVER_GPUS" data.train_batch_size="$PROBLEMS" \
  mlmt.feedback="$FEEDBACK" \
  mlmt.ll.adv_estimator=archer mlmt.n=1 mlmt.m=1 \
  mlmt.archer.actor_signal="$SIGNAL" \
  mlmt.archer.gamma=0.95 mlmt.archer.lr=1e-5 mlmt.archer.buffer_size=4096 mlmt.archer.batch_size=64 \
  mlmt.archer.updates_per_step=8 mlmt.archer.target_refresh_every=10 \
  trainer.project_name=mlmt_baselines trainer.experiment_name="archer_${TASK}_${FEEDBACK}" \
  "$@"
