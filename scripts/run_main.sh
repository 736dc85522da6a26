#!/usr/bin/env bash
# README command 1: install (idempotent) and run the main job on the embedded default.
#
#   bash scripts/run_main.sh [key=value ...]
#
# Trains the solver and the feedback writer (SmolLM2-135M-Instruct each) on generated arithmetic problems for a few
# steps on whatever hardware is present, then prints where the checkpoints, logs and plot are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/python -m verl.trainer.main_mlmt "$@"
