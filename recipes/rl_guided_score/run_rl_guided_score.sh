#!/usr/bin/env bash
# RL-guided SCoRe (hrl-reasoning's RLGuidedSCoReTrainer): the SCoRe solver (two stages, as recipes/score) whose second
# attempt reads a correction hint from a guidance model, and the guidance model trained by REINFORCE on whether the
# solver's second attempt is correct (hl_reward=r3), with a KL penalty to its own reference (verl's actor KL loss,
# guidance_kl_coef = 0.05) at guidance_lr = 1e-6 — the seed's rl_guided_score_math.yaml. The KL's estimator is k3
# (low_var_kl, as MLMT's per-turn β): k1 (kl) has an expected gradient of 0 and is refused. On this trainer the guidance
# model is the HL level (its own workers, optimizer, reference and checkpoint), updated on every step with the solver.
# The original's bug (the guidance gradient never reached the model) is not reproduced: the e2e test shows the
# guidance model moving away from its reference.
#
#   bash recipes/rl_guided_score/run_rl_guided_score.sh [key=value ...]          # a GPU node, 2 GPUs per model
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/rl_guided_score/run_rl_guided_score.sh
#
# Environment: MODEL / LL_MODEL / HL_MODEL (the guidance model), DATA_DIR, LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON.
# W&B project mlmt_baselines; outputs in outputs/mlmt_baselines/rl_guided_score. Evaluate like MLMT:
#   bash mlmt-configs/math/eval_math500.sh RUN/export/global_step_N/ll RUN/export/global_step_N/hl
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${LATER[@]}" "${RR[@]}" \
  "${SCORE_STAGES[@]}" \
  mlmt.reward.hl_reward=r3 mlmt.schedule.tH=1 mlmt.schedule.tL=1 \
  hl.actor.optim.lr=1e-6 hl.actor.use_kl_loss=true hl.actor.kl_loss_coef=0.05 hl.actor.kl_loss_type=low_var_kl \
  trainer.project_name=mlmt_baselines trainer.experiment_name=rl_guided_score \
  "$@"
