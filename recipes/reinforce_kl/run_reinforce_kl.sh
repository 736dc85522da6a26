#!/usr/bin/env bash
# REINFORCE with a refreshed reference KL on GSM8K: LLM_RL's "stable REINFORCE" (seed 004, its
# examples/reinforce_stable_on_gsm8k_training.py). One model, one turn (mlmt.feedback=none), REINFORCE without a
# baseline on the math-verify reward, minus β·KL to a reference model (mlmt.stages.beta_turn1 = the seed's kl_coeff
# 0.25) that is replaced by the current policy after every 2nd step (mlmt.ll.ref_refresh_freq = update_ref_iterations
# 2), on 5-shot GSM8K prompts (baked into the parquet rows by the preprocess command below). Llama-3.2-1B-Instruct; the
# seed reports 22% -> 38% GSM8K accuracy.
#
#   # once: 5-shot GSM8K train / val / test (examples from the train split less the validation slice, seeded per
#   # row, never the item itself; val = 500 seeded GSM8K train problems removed from train, held out from test)
#   bash examples/data_preprocess/prepare_all.sh ../shared/data data
#   bash recipes/reinforce_kl/run_reinforce_kl.sh [key=value ...]                        # a GPU node (GPUS=4)
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/reinforce_kl/run_reinforce_kl.sh   # on Slurm
#
# Environment: MODEL (default meta-llama/Llama-3.2-1B-Instruct), DATA_DIR (default data: $DATA_DIR/gsm8k_5shot/
# {train,val}.parquet; or TRAIN_FILES / VAL_FILES), GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_baselines; outputs
# in outputs/mlmt_baselines/reinforce_kl (a rerun resumes, the reference as it was at the checkpoint).
# Evaluate (greedy, GSM8K test, 5-shot):
#   python -m agent_system.launcher.export --run-dir outputs/mlmt_baselines/reinforce_kl
#   python -m agent_system.eval.math500 --ll outputs/mlmt_baselines/reinforce_kl/export/global_step_N/ll \
#       --rounds 0 --data data/gsm8k_5shot/test.parquet --out eval/reinforce_kl --max-tokens 512
set -xeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/experiment_common.sh"

mlmt_run "${SOLVER_ONLY[@]}" "${MATH[@]}" "${LATER[@]}" \
  data.train_files="${TRAIN_FILES:-$DATA_DIR/gsm8k_5shot/train.parquet}" \
  data.val_files="${VAL_FILES:-$DATA_DIR/gsm8k_5shot/val.parquet}" \
  mlmt.feedback=none \
  mlmt.ll.adv_estimator=reinforce mlmt.n=1 \
  mlmt.stages.beta_turn1=[0.25] mlmt.stages.kl_in=advantage \
  mlmt.ll.ref_refresh_freq=2 \
  data.train_batch_size=100 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  trainer.project_name=mlmt_baselines trainer.experiment_name=reinforce_kl \
  "$@"
