#!/usr/bin/env bash
# Resolve the GPU install set (verl[vllm]==0.9.1 + this project's requirements) without downloading it, and write
# requirements/constraints-gpu.txt (exact pins for GPU clusters: torch 2.11.0, vLLM 0.24.0, CUDA 13 wheels).
#
#   bash scripts/compile_gpu_constraints.sh            # needs `uv` (pip install uv==0.9.8) and PyPI access (~25 s)
#
# uv reads wheel metadata only (~60 MB); --no-config ignores machine-local pip settings (e.g. a torch cap).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
input=$(mktemp --suffix=.in)
trap 'rm -f "$input"' EXIT
{
  echo "verl[vllm]==0.9.1"
  grep -vE '^\s*(#|$)|^torch|^verl|^pytest|^ruff' requirements.txt
} > "$input"
"$UV" pip compile "$input" --python-version 3.12 --python-platform x86_64-manylinux_2_28 --no-config \
  --no-header --no-annotate --quiet -o requirements/constraints-gpu.txt
echo "wrote requirements/constraints-gpu.txt ($(grep -c '==' requirements/constraints-gpu.txt) pins)"
grep -E '^(torch|vllm|verl|transformers|ray)==' requirements/constraints-gpu.txt
