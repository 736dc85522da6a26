#!/usr/bin/env bash
# SCoRe (Kumar et al., 2024), the seed's ScoRe.sh: one model, two turns — an attempt, then the fixed self-correction
# instruction ("Check your attempt and write a corrected solution", the refine_no_feedback template) and a second
# attempt (mlmt.feedback=self: no feedback writer). Stage I (steps 1-249): the second attempt is rewarded and the
# first is held to the reference (KL β 0.1 on it, 0.01 on the second); stage II (from step 250): both turns rewarded
# plus the progress bonus α(R2 − R1), α = 10, β 0.01 on both. REINFORCE, one attempt per problem, 500 steps.
#
#   bash recipes/score/run_score.sh [key=value ...]                        # a GPU node (GPUS=4 devices)
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/score/run_score.sh   # on Slurm
#
# Environment: MODEL, DATA_DIR (or TRAIN_FILES / VAL_FILES), GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_baselines;
# outputs in outputs/mlmt_baselines/score. Evaluate the self-correction:
#   bash mlmt-configs/math/eval_math500.sh outputs/mlmt_baselines/score/export/global_step_N/ll --self-correct
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"

mlmt_run "${SOLVER_ONLY[@]}" "${MATH[@]}" "${LATER[@]}" \
  mlmt.feedback=self \
  mlmt.ll.adv_estimator=reinforce mlmt.n=1 mlmt.m=1 \
  "${SCORE_STAGES[@]}" mlmt.stages.returns=score \
  trainer.project_name=mlmt_baselines trainer.experiment_name=score \
  "$@"
