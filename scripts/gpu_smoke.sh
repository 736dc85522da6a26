#!/usr/bin/env bash
# GPU smoke runs (tests/gpu): what CI cannot check, in one command on any GPU node; writes a Markdown report.
#
#   bash scripts/gpu_smoke.sh [report.md]          # default: gpu_smoke_report.md in the repository
#
# Runs `pytest -m gpu tests/gpu` with the project's Python ($MLMT_PYTHON, default .venv/bin/python). Each scenario
# appends a JSON line (passed, seconds, peak memory per device); the report lists them, then pytest's own summary, in
# which tests skipped without CUDA (or with one GPU, the two-GPU scenario) are counted as not run.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${MLMT_PYTHON:-$PWD/.venv/bin/python}
report=${1:-$PWD/gpu_smoke_report.md}
jsonl=$(mktemp)
log=$(mktemp)
trap 'rm -f "$jsonl" "$log"' EXIT

MLMT_GPU_SMOKE_JSONL=$jsonl "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu -rA tests/gpu 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

"$PYTHON" - "$jsonl" "$log" "$report" "$status" <<'PY'
import json
import subprocess
import sys
from pathlib import Path

jsonl, log, report, status = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(line) for line in Path(jsonl).read_text().splitlines() if line.strip()]
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
except OSError:
    smi = ""
smi = smi or "no GPU (nvidia-smi missing or found none)"
summary = [line for line in Path(log).read_text().splitlines() if line.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR"))]
summary += [line for line in Path(log).read_text().splitlines()[-3:] if " in " in line]
lines = ["# GPU smoke report", "", f"Devices: {smi}", "", "| scenario | result | seconds | peak memory per device (MiB) |",
         "|---|---|---|---|"]
for row in rows:
    peaks = ", ".join(f"GPU {index}: {mib}" for index, mib in sorted(row["peak_mib"].items())) or "-"
    lines.append(f"| {row['scenario']} | {'passed' if row['passed'] else 'FAILED'} | {row['seconds']} | {peaks} |")
if not rows:
    lines.append("| (none ran) | not run | - | - |")
lines += ["", "pytest (skipped = not run):", "", "```", *summary, "```", ""]
Path(report).write_text("\n".join(lines))
print(f"report: {report} (pytest exit status {status})")
PY
exit "$status"
