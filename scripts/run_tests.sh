#!/usr/bin/env bash
# README command 2: install (idempotent) and run the test suite (unit, integration, end-to-end; GPU tests skip).
#
#   bash scripts/run_tests.sh [pytest args ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/python -m pytest -q "$@" tests
