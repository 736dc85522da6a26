#!/usr/bin/env bash
# Bi-level value shaping (hrl-reasoning's MLMT-RL, docs/METHOD.md "Value shaping"; recipes/value_shaping/README.md): the
# solver's value model V (verl's critic) is its baseline, (R − V)·(log π_L(z) + log π_L(ŷ)) plus (V − R)²; the feedback
# writer is trained by REINFORCE on R + value_coef·V(x, z, g), R ∈ {−1, +1} the verifier's symmetric reward on the
# refined answer. VALUE_GRAD=stop: V is a number in the HL's reward (plain reward shaping); VALUE_GRAD=full: the HL's
# objective also trains V (its term in the critic's loss). The original's swapped flags are not reproduced: the value is
# named for what it does.
#
#   VALUE_GRAD=stop bash recipes/value_shaping/run_value_shaping.sh [key=value ...]   # a GPU node, 2 GPUs per model
#   VALUE_GRAD=full bash recipes/value_shaping/run_value_shaping.sh
#   VALUE_GRAD=full sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/value_shaping/run_value_shaping.sh
#
# Environment: VALUE_GRAD (stop | full, default stop), VALUE_COEF (default 0.1), MODEL / LL_MODEL / HL_MODEL,
# DATA_DIR, LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_baselines; experiment value_shaping_<VALUE_GRAD>,
# outputs in outputs/mlmt_baselines/value_shaping_<VALUE_GRAD>. Evaluate like MLMT:
#   bash mlmt-configs/math/eval_math500.sh RUN/export/global_step_N/ll RUN/export/global_step_N/hl
set -xeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"
VALUE_GRAD=${VALUE_GRAD:-stop}
VALUE_COEF=${VALUE_COEF:-0.1}

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${LATER[@]}" "${RR[@]}" \
  mlmt.ll.adv_estimator=value_baseline critic.optim.lr=1e-5 \
  mlmt.reward.hl_reward=value_shaped mlmt.value_shaping.value_coef="$VALUE_COEF" \
  mlmt.value_shaping.value_grad="$VALUE_GRAD" mlmt.value_shaping.symmetric_reward=true \
  mlmt.schedule.tH=1 mlmt.schedule.tL=1 \
  hl.actor.use_kl_loss=true hl.actor.kl_loss_coef=0.05 hl.actor.kl_loss_type=low_var_kl \
  trainer.project_name=mlmt_baselines trainer.experiment_name="value_shaping_$VALUE_GRAD" \
  "$@"
