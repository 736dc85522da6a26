# Sourced by the experiment scripts in mlmt-configs/{math,code}/ (not run on its own): the settings shared by the
# original's runs (docs/METHOD.md, "The original's runs") as bash arrays, and the environment knobs every script
# honours.
#
#   MODEL=...          both levels' initial model (default meta-llama/Llama-3.2-1B-Instruct, the scripts' SHARED_MODEL)
#   LL_MODEL=...       the solver's model (default $MODEL);  HL_MODEL=... the feedback writer's (default $MODEL)
#   DATA_DIR=data      where `bash examples/data_preprocess/prepare_all.sh` (or agent_system.data.preprocess) wrote
#                      the parquet files; TRAIN_FILES / VAL_FILES override the two paths themselves
#   LL_GPUS=2 HL_GPUS=2  devices per level (split placement; the original: one 4-GPU node, half per level)
#   GPUS_PER_NODE=...  devices of each node (trainer.n_gpus_per_node; default LL_GPUS + HL_GPUS, both pools on one
#                      node; the solver-only baselines: GPUS). Several nodes: the node's count, e.g. 2 × 8 GPUs is
#                      LL_GPUS=8 HL_GPUS=8 GPUS_PER_NODE=8 with trainer.nnodes=2 (the sbatch passes it)
#   LOGGER='[console,tensorboard,wandb]'   verl's Tracking backends (W&B reads WANDB_API_KEY from the environment)
#   KEEP_CKPTS=2       checkpoints kept (trainer.max_actor_ckpt_to_keep; null: all): a 1.5B + 7B full fine-tuning
#                      save is ~110 GB
#   KEEP_BEST=val/final_acc  also keep the best validation step's checkpoint (trainer.keep_best; null: off)
#   MLMT_PYTHON=...    the interpreter that runs `-m verl.trainer.main_mlmt` (default: the repository's
#                      .venv/bin/python, wherever the script is run from; scripts/lib/python.sh)
#
# Every script ends its command with "$@", so command-line overrides (and Hydra flags such as `--cfg job`) win.

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/python.sh"  # MLMT_PYTHON, or one line naming what is missing
MODEL=${MODEL:-meta-llama/Llama-3.2-1B-Instruct}
LL_MODEL=${LL_MODEL:-$MODEL}
HL_MODEL=${HL_MODEL:-$MODEL}
DATA_DIR=${DATA_DIR:-data}
LL_GPUS=${LL_GPUS:-2}
HL_GPUS=${HL_GPUS:-2}
LOGGER=${LOGGER:-[console,tensorboard,wandb]}
KEEP_CKPTS=${KEEP_CKPTS:-2}
KEEP_BEST=${KEEP_BEST:-val/final_acc}

# Models, devices and logging: the same in every run.
COMMON=(
  actor_rollout_ref.model.path="$LL_MODEL"
  hl.model.path="$HL_MODEL"
  mlmt.placement=split
  mlmt.ll_gpus="$LL_GPUS"
  mlmt.hl_gpus="$HL_GPUS"
  trainer.n_gpus_per_node="${GPUS_PER_NODE:-$((LL_GPUS + HL_GPUS))}"
  trainer.logger="$LOGGER"
  trainer.resume_mode=auto
  trainer.max_actor_ckpt_to_keep="$KEEP_CKPTS"
  trainer.keep_best="$KEEP_BEST"
)

# "RR": REINFORCE at both levels (no baseline), one attempt and one feedback per problem, as every original script.
RR=(
  mlmt.ll.adv_estimator=reinforce
  mlmt.hl.adv_estimator=reinforce
  mlmt.n=1
  mlmt.m=1
)

# The math runs' hyper-parameters (docs/METHOD.md, "The original's runs"): 128 problems per step, prompt 4096 and
# response 1024 tokens at every turn (the original's HL generated up to max_response_length too), full fine-tuning at lr
# 5e-7 (constant, AdamW weight decay 0.01, grad clip 1.0: verl's defaults), PPO clip 0.2, one epoch, token-mean loss,
# entropy 0.001, mini-batches of 128 rows.
MATH=(
  data.train_files="${TRAIN_FILES:-$DATA_DIR/math/train.parquet}"
  data.val_files="${VAL_FILES:-$DATA_DIR/math/val.parquet}"
  data.train_batch_size=128
  data.max_prompt_length=4096
  data.max_response_length=1024
  hl.rollout.response_length=1024
  actor_rollout_ref.actor.optim.lr=5e-7
  hl.actor.optim.lr=5e-7
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant
  hl.actor.optim.lr_scheduler_type=constant
  actor_rollout_ref.actor.clip_ratio=0.2
  hl.actor.clip_ratio=0.2
  actor_rollout_ref.actor.ppo_epochs=1
  hl.actor.ppo_epochs=1
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  hl.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.entropy_coeff=0.001
  hl.actor.entropy_coeff=0.001
  actor_rollout_ref.actor.ppo_mini_batch_size=128
  hl.actor.ppo_mini_batch_size=128
  trainer.project_name=mlmt_math
)

# SCoRe-style stages of the math scripts (docs/METHOD.md, "Stages and schedules"): stage I (turn-1 reward = −β·KL only)
# with β 0.1 on turn 1 and 0.01 on turn 3, switching at step 200 to stage II with β 0.01 on turns 1 and 3 and the
# progress bonus α = 10 on turns 3 and 1 (docs/METHOD.md, "The progress bonus"; α has no effect in stage I, where the
# original also set it). The original's β2 0.1 (stage I) and β1 0.01 (stage II) are beta_turn1's two values, its β_L
# beta_turn3 and β_H beta_turn2 (docs/CONFIG.md).
# The original never created a reference model, so its β terms were inert (docs/METHOD.md, "Where this differs from the
# original"); here β > 0 creates the LL's reference model and the KL terms act.
MATH_STAGES=(
  mlmt.stages.schedule=[0,200]
  mlmt.stages.stage_ids=[1,2]
  mlmt.stages.beta_turn1=[0.1,0.01]
  mlmt.stages.beta_turn2=[0.0,0.0]
  mlmt.stages.beta_turn3=[0.01,0.01]
  mlmt.stages.alpha=[0.0,10.0]
)

# SCoRe's stages (the seed's ScoRe.sh; docs/METHOD.md, "SCoRe"): stage I for 250 steps (β 0.1 on turn 1, 0.01 on
# turn 3), then stage II (β 0.01 on turns 1 and 3, α = 10). Used by recipes/score and recipes/rl_guided_score.
SCORE_STAGES=("${MATH_STAGES[@]}" mlmt.stages.schedule=[0,250])  # the same stages, switching at 250

# One model on all GPUS devices (the baselines without a feedback writer).
SOLVER_ONLY=(
  actor_rollout_ref.model.path="$LL_MODEL"
  mlmt.placement=split
  mlmt.ll_gpus="${GPUS:-4}"
  trainer.n_gpus_per_node="${GPUS_PER_NODE:-${GPUS:-4}}"
  trainer.logger="$LOGGER"
  trainer.resume_mode=auto
  trainer.max_actor_ckpt_to_keep="$KEEP_CKPTS"
  trainer.keep_best="$KEEP_BEST"
)

# Temperature and length of the early scripts (_1_1, _1_15, _1_20 at v-head): sampling at 0.1, 400 steps.
# The original's early scripts ran `total_epochs=3` and switched to stage II at global step 200; a step is one batch
# of 128 problems there and here, so the switch stays at step 200. Three epochs of MATH's 7,500 training problems at
# 128 per step are only 3 · ⌊7500/128⌋ = 174 steps here, which never reach step 200 (the original's step count came
# from a dataloader it shrank to 240 rows in stage I while its environment read the file on its own: not this trainer's).
# So the early scripts run a fixed 400 steps (≈ 6.8 epochs): stage I on steps 1-199, stage II from step 200 to 400,
# about as long as stage I (SCoRe's script also splits its 500 steps at 250).
EARLY=(
  actor_rollout_ref.rollout.temperature=0.1
  hl.rollout.temperature=0.1
  trainer.total_training_steps=400
  trainer.total_epochs=999
  trainer.save_freq=50
)

# Temperature and length of the later scripts (_1_10, _5_20 at v-new): sampling at 1.0, a fixed step count.
LATER=(
  actor_rollout_ref.rollout.temperature=1.0
  hl.rollout.temperature=1.0
  trainer.total_training_steps=500
  trainer.total_epochs=999
  trainer.save_freq=50
)

# Print the command, then run it in place of the shell (Slurm's signals then reach the trainer directly).
mlmt_run() {
  echo "+ $MLMT_PYTHON -m verl.trainer.main_mlmt $*" >&2
  exec "$MLMT_PYTHON" -m verl.trainer.main_mlmt "$@"
}
