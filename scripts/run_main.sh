#!/usr/bin/env bash
# README command 1: install (idempotent) and run the main job on the embedded default.
#
#   bash scripts/run_main.sh [key=value ...]
#
# Trains the solver and the feedback writer (SmolLM2-135M-Instruct each) on generated arithmetic problems for a few
# steps on whatever hardware is present, then prints where the checkpoints, logs and plot are. With MLMT_PYTHON set,
# that interpreter runs it and nothing is installed (scripts/lib/python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${MLMT_PYTHON:-}" ] || bash scripts/install.sh
source scripts/lib/python.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec "$MLMT_PYTHON" -m verl.trainer.main_mlmt "$@"
