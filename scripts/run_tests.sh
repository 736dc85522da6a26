#!/usr/bin/env bash
# README command 2: install (idempotent) and run every tier of the test suite, one pytest run per tier, then print
# each tier's wall time. GPU tests skip on a machine without one.
#
#   bash scripts/run_tests.sh [pytest args ...]          # every tier: unit, integration, e2e, gpu
#   MLMT_TEST_TIERS="unit e2e" bash scripts/run_tests.sh  # some tiers (the folders under tests/)
#
# The pytest args go to every tier's run. Each tier runs even when an earlier one failed; the exit status is 1 when
# any tier failed. A bare `pytest` runs the unit tier alone (pyproject.toml's testpaths).
#
# The unit, integration and e2e tiers run on MLMT_TEST_WORKERS pytest-xdist workers (default 2; 1 runs one test at a
# time). Two fit on two cores: Ray gives each worker process one thread (OMP_NUM_THREADS=1) and a run's phases mostly
# wait on one another, so one test keeps about one core busy. `--dist loadgroup` keeps the tests marked
# `xdist_group("heavy")` (the vLLM runs that peak at 5-9 GB, and the Slurm run with its 3-minute time limit) on one
# worker, one after another, so two of them never meet: the peak stays near 9 GB + 5 GB of a light test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
tiers="${MLMT_TEST_TIERS:-unit integration e2e gpu}"
summary=()
failed=0
for tier in $tiers; do
  if [ ! -d "tests/$tier" ]; then
    echo "run_tests.sh: no tier tests/$tier (MLMT_TEST_TIERS=\"$tiers\"; tiers are the folders under tests/)" >&2
    exit 2
  fi
  echo "=== tier $tier: tests/$tier"
  started=$(date +%s)
  status=0
  # --durations=15: the slowest tests; tests/_ci_guard.py prints the tier's peak memory and any leftover processes.
  parallel=()
  if [ "$tier" != gpu ] && [ "${MLMT_TEST_WORKERS:-2}" -gt 1 ]; then
    parallel=(-n "${MLMT_TEST_WORKERS:-2}" --dist loadgroup)
  fi
  .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "$@" "tests/$tier" || status=$?
  seconds=$(($(date +%s) - started))
  case $status in
    0) verdict=passed ;;
    5) verdict="no test selected" ;;
    *) verdict="FAILED (pytest exit $status)"; failed=1 ;;
  esac
  summary+=("$(printf '%-12s %4dm%02ds  %s' "$tier" $((seconds / 60)) $((seconds % 60)) "$verdict")")
done
echo "=== wall time per tier"
printf '%s\n' "${summary[@]}"
exit "$failed"
