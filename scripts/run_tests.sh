#!/usr/bin/env bash
# README command 2: install (idempotent) and run every tier of the test suite, one pytest run per tier, then print
# each tier's wall time. GPU tests skip on a machine without one.
#
#   bash scripts/run_tests.sh [pytest args ...]          # every tier: unit, integration, e2e, gpu
#   MLMT_TEST_TIERS="unit e2e" bash scripts/run_tests.sh  # some tiers (the folders under tests/)
#   MLMT_TEST_SET=extended bash scripts/run_tests.sh      # the tests marked `extended` (left out per commit)
#   MLMT_TEST_SET=all bash scripts/run_tests.sh           # both
#   MLMT_TEST_SET=study bash scripts/run_tests.sh         # the learning study (tests marked `study`, which any run
#                                                         # without `-m study` leaves out: tests/conftest.py)
#
# By default (MLMT_TEST_SET=commit, what CI runs) the tests marked `extended` are left out: the runs that repeat a path
# the per-commit set already takes (docs/MEASUREMENTS.md, "Test suite", says which run where).
#
# First ruff (check and format --check, the version pinned in requirements/constraints-cpu.txt; .pre-commit-config.yaml
# runs the same before a commit). The pytest args go to every tier's run. Each tier runs even when ruff or an earlier
# tier failed; the exit status is 1 when any failed. A bare `pytest` runs the fast unit tier alone (pyproject.toml's
# testpaths, without the tests marked `external` or `slow`); naming the tier, as here, runs all of it.
#
# Every tier runs on two pytest-xdist workers (MLMT_TEST_WORKERS sets every tier's count; 1 runs one test at a time).
# Tests are independent (each has its own Ray cluster, ports and folders), and one e2e run leaves a core idle 35-50 %
# of the time: its processes (driver, workers, servers) mostly take turns, each on one thread. Two runs at once peak
# at about 17 GB. On a machine that busy, Ray's raylet can abort a local start (it waits at most 15 s for its
# dashboard agent to import); the trainer and the tests' Ray fixtures start again then (start_local_ray in
# agent_system/launcher/main.py; dev/MEASUREMENTS_LOG.md, "Two tests at a time").
#
# On several workers, the integration and e2e tiers hand out one test at a time, the longest `slow` ones first
# (tests/conftest.py), so that no long test starts last; and every process computes on one thread
# (OMP_NUM_THREADS=1, as Ray gives its workers): two processes each spinning two OpenMP threads on 2 cores slowed each
# other sixfold (training the cue task's solver: 55 s alone; two at once 6 min, 86 s on one thread each).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
tiers="${MLMT_TEST_TIERS:-unit integration e2e gpu}"
case "${MLMT_TEST_SET:-commit}" in
  commit) selection=(-m "not extended") ;;
  extended) selection=(-m extended) ;;
  all) selection=() ;;
  study) selection=(-m study) ;;
  *) echo "run_tests.sh: MLMT_TEST_SET=${MLMT_TEST_SET} (use commit, extended, all or study)" >&2; exit 2 ;;
esac
summary=()
failed=0
echo "=== ruff: check and format --check"
lint=passed
.venv/bin/ruff check . && .venv/bin/ruff format --check . || { lint=FAILED; failed=1; }
summary+=("$(printf '%-12s %9s  %s' ruff "" "$lint")")
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
  threads=()
  workers="${MLMT_TEST_WORKERS:-2}"
  if [ "$workers" -gt 1 ]; then
    parallel=(-n "$workers")
    threads=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
    # the unit tier's hundreds of short tests go in batches; one test at a time for the others
    [ "$tier" = unit ] || parallel+=(--dist load --maxschedchunk 1)
  fi
  "${threads[@]}" .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "${selection[@]}" "$@" "tests/$tier" || status=$?
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
