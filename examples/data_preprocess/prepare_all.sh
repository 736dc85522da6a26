#!/usr/bin/env bash
# Convert the benchmark datasets to verl parquet (data_source, prompt, ability, reward_model, extra_info).
#
#   bash examples/data_preprocess/prepare_all.sh [SHARED_DATA_DIR] [OUT_DIR]
#
# Reads local JSONL (default ../shared/data); omit --input in a command below to read the Hugging Face hub instead.
set -xeuo pipefail
DATA=${1:-../shared/data}
OUT=${2:-data}
PY=${PYTHON:-python}
$PY -m agent_system.data.preprocess --dataset math --input "$DATA/math/train.jsonl" --output "$OUT/math/train.parquet" --skip-bad-rows
$PY -m agent_system.data.preprocess --dataset math --input "$DATA/math/test.jsonl" --output "$OUT/math/test.parquet"
$PY -m agent_system.data.preprocess --dataset math500 --input "$DATA/math500/test.jsonl" --output "$OUT/math500/test.parquet"
$PY -m agent_system.data.preprocess --dataset gsm8k --input "$DATA/gsm8k/train.jsonl" --output "$OUT/gsm8k/train.parquet"
$PY -m agent_system.data.preprocess --dataset gsm8k --input "$DATA/gsm8k/test.jsonl" --output "$OUT/gsm8k/test.parquet"
$PY -m agent_system.data.preprocess --dataset mbpp --input "$DATA/mbpp/mbpp.jsonl" --output "$OUT/mbpp/mbpp.parquet"
$PY -m agent_system.data.preprocess --dataset mbpp_sanitized --input "$DATA/mbpp/sanitized-mbpp.jsonl" --output "$OUT/mbpp/sanitized.parquet"
