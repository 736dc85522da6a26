#!/usr/bin/env bash
# MLMT vs its baselines, trained and evaluated alike: every baseline's own run script (mlmt-configs/math/*.sh,
# recipes/*/run_*.sh) with the same model, steps, batch, lengths and seed, then export and eval_math500.sh; one table
# (comparison.md / .json) and one plot (comparison.png) in --out. A rerun continues where it stopped.
#
#   bash recipes/compare.sh --out compare/cpu --steps 2 --limit 8 --eval-data data/math500/test.parquet
#   bash recipes/compare.sh --out compare/gpu --model meta-llama/Llama-3.2-1B-Instruct --steps 500 --batch 128 \
#       --max-tokens 1024 --feedback-tokens 1024 --max-prompt-tokens 4096 --train data/math/train.parquet --limit 0
#   bash recipes/compare.sh --out compare/cpu --baselines mlmt,grpo -- actor_rollout_ref.actor.optim.lr=1e-6
#   bash recipes/compare.sh --out compare/cpu --set archer:mlmt.archer.batch_size=4   # one baseline's override
#
# Options: `python -m agent_system.comparisons.compare --help`. The interpreter: MLMT_PYTHON, else the repository's
# .venv/bin/python (scripts/lib/python.sh), from any folder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh
exec "$MLMT_PYTHON" -m agent_system.comparisons.compare "$@"
