#!/usr/bin/env bash
# HLT_LLT_RR_1_10_LoRA: the typical math run (HLT_LLT_RR_1_10: REINFORCE at both levels, 10 LL steps then 1 HL step,
# temperature 1.0, 500 steps, the SCoRe stages) with the original's LoRA settings at both levels (docs/LORA.md):
# rank 16, alpha 32 on all of q/k/v/o/gate/up/down, 64 problems per step
# (mini-batches of 64 rows: the LL's 128 rows make 2 optimizer steps per update, the HL's 64 rows one, as the
# original's mini-batch was capped at its batch), lr 1e-6, on Llama-3.2-3B-Instruct as hrl-reasoning ran it with LoRA.
#
# Not the original's in three ways, because verl 0.9.1 has no key for them:
# - LoRA dropout: the original used 0.05; verl's FSDP LoRA keys (<tree>.model.lora_rank / lora_alpha / target_modules)
#   have no dropout, so PEFT's default 0.0 applies (<tree>.model.lora.dropout is Megatron-only and refused at start-up);
# - trainer.lora_only_save: checkpoints hold the full model shards (plus verl's lora_train_meta.json);
# - the LL's reference model (β > 0 in the stages) is a second copy of the base, not the base with the adapter off.
# Not yet run or tested under the trainer: that the adapters train, adapter-only checkpoints, export and evaluation
# with adapters (issue 20). `bash mlmt-configs/math/HLT_LLT_RR_1_10_LoRA.sh mlmt.plan_only=true` shows the trainable
# parameters per level (about 24.3 M of 3.21 B for the 3B model) before anything starts.
#
#   bash mlmt-configs/math/HLT_LLT_RR_1_10_LoRA.sh [key=value ...]                         # a GPU node
#   sbatch mlmt-configs/math/submit_mlmt.sbatch mlmt-configs/math/HLT_LLT_RR_1_10_LoRA.sh  # on Slurm
#
# Runs `python -m verl.trainer.main_mlmt` (printing the full command first) with the shared settings of
# mlmt-configs/experiment_common.sh plus the overrides below, then your own ("$@", last, so they win). Environment:
# MODEL (default meta-llama/Llama-3.2-3B-Instruct) / LL_MODEL / HL_MODEL, DATA_DIR (or TRAIN_FILES / VAL_FILES),
# LL_GPUS / HL_GPUS, LOGGER, MLMT_PYTHON. W&B project mlmt_math; outputs in outputs/mlmt_math/HLT_LLT_RR_1_10_LoRA
# (a rerun resumes from the latest checkpoint).
set -euo pipefail
MODEL=${MODEL:-meta-llama/Llama-3.2-3B-Instruct}
source "$(dirname "${BASH_SOURCE[0]}")/../experiment_common.sh"

TARGETS=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]

mlmt_run "${COMMON[@]}" "${MATH[@]}" "${MATH_STAGES[@]}" \
  "${RR[@]}" "${LATER[@]}" \
  mlmt.schedule.tH=1 mlmt.schedule.tL=10 \
  data.train_batch_size=64 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 hl.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.optim.lr=1e-6 hl.actor.optim.lr=1e-6 \
  actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32 \
  actor_rollout_ref.model.target_modules="$TARGETS" \
  hl.model.lora_rank=16 hl.model.lora_alpha=32 \
  hl.model.target_modules="$TARGETS" \
  trainer.experiment_name=HLT_LLT_RR_1_10_LoRA \
  "$@"
