#!/usr/bin/env bash
# Convert the benchmark datasets to verl parquet (data_source, prompt, ability, reward_model, extra_info): every file
# the scripts under mlmt-configs/ and recipes/ read by default, with held-out validation sets
# (agent_system/data/prepare.py: math/val.parquet from MATH test less MATH-500, gsm8k/val.parquet a slice of GSM8K
# train removed from gsm8k/train.parquet, mbpp/val.parquet MBPP's validation task_ids 511-600).
#
#   bash examples/data_preprocess/prepare_all.sh [SHARED_DATA_DIR] [OUT_DIR]
#
# Reads local JSONL (default ../shared/data). The same files from the public datasets on the Hugging Face hub:
# python -m agent_system.data.prepare --from-hub --out data (--from DIR: a copy of the hub repositories).
# The interpreter: MLMT_PYTHON, else the repository's .venv/bin/python (scripts/lib/python.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/python.sh"
set -x
DATA=${1:-../shared/data}
OUT=${2:-data}
"$MLMT_PYTHON" -m agent_system.data.prepare --data "$DATA" --out "$OUT"
