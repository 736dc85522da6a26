#!/usr/bin/env bash
# README command 2: install (idempotent) and run the test suite (unit, integration, end-to-end; GPU tests skip).
#
#   bash scripts/run_tests.sh [pytest args ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
# --durations=15: the slowest tests; tests/_ci_guard.py prints the suite's peak memory and any leftover processes.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@" tests
