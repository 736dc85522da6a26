#!/usr/bin/env bash
# MLMT on MATH train, validated on 500 held-out MATH test problems that are not in MATH-500 (data/math/val.parquet;
# evaluate on MATH-500), with the (tH, tL) = (1, 15) schedule of the seed's HLT_LLT_RR_1_15.
#
#   bash examples/quickstart_math500.sh [key=value ...]
#
# Needs data/ from examples/data_preprocess/prepare_all.sh. On CPU this is slow with real models: it is the shape of a
# GPU run (set the model paths to e.g. Llama-3.2-1B-Instruct folders and trainer.n_gpus_per_node). The prompt budget is
# stated because the CPU overlay's 768 tokens cannot hold MATH's longest problems (start-up checks it).
# The interpreter: MLMT_PYTHON, else the repository's .venv/bin/python (scripts/lib/python.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/python.sh"
set -x
"$MLMT_PYTHON" -m verl.trainer.main_mlmt \
    data.train_files=data/math/train.parquet \
    data.val_files=data/math/val.parquet \
    data.max_prompt_length=4096 data.max_response_length=1024 hl.rollout.response_length=512 \
    mlmt.n=4 mlmt.m=2 mlmt.schedule.tH=1 mlmt.schedule.tL=15 \
    trainer.total_training_steps=100 trainer.save_freq=20 trainer.test_freq=20 \
    trainer.experiment_name=math_rr_1_15 "$@"
