# The one interpreter rule, sourced by every launcher (mlmt-configs/, recipes/, examples/, scripts/run_main.sh, the
# sbatch script); not run on its own. It sets MLMT_PYTHON (exported, an absolute path) and MLMT_REPO:
#
#   MLMT_PYTHON=/path/to/python   that interpreter (or a command on PATH: MLMT_PYTHON=python3)
#   MLMT_PYTHON unset             the repository's venv, $MLMT_REPO/.venv/bin/python, the repository found from this
#                                 file's location (not $PWD): a script runs the same Python from any folder
#
# `.venv` is the repository's one venv: the CPU build (`bash scripts/install.sh`) or, on a GPU node, the GPU build
# (README, "GPU install"; `bash scripts/gpu_check.sh` installs it there). A missing interpreter stops the script with
# one line that names it and the command that installs it (exit 127, as the shell's own "command not found").
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/python.sh"      # from a script one folder down

MLMT_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -n "${MLMT_PYTHON:-}" ]; then
  if [[ "$MLMT_PYTHON" != */* ]] && command -v "$MLMT_PYTHON" >/dev/null 2>&1; then
    MLMT_PYTHON=$(command -v "$MLMT_PYTHON")  # a command on PATH
  elif [[ "$MLMT_PYTHON" == */* && "$MLMT_PYTHON" != /* && -d "$(dirname "$MLMT_PYTHON")" ]]; then
    MLMT_PYTHON=$(cd "$(dirname "$MLMT_PYTHON")" && pwd)/$(basename "$MLMT_PYTHON")  # absolute, symlinks kept
  fi
  if [ ! -f "$MLMT_PYTHON" ] || [ ! -x "$MLMT_PYTHON" ]; then
    echo "$(basename "$0"): MLMT_PYTHON=$MLMT_PYTHON is not an executable file: point it at a Python with MLMT-RL" \
      "installed, or unset it to use the repository's venv ($MLMT_REPO/.venv/bin/python)" >&2
    exit 127
  fi
else
  MLMT_PYTHON=$MLMT_REPO/.venv/bin/python
  if [ ! -x "$MLMT_PYTHON" ]; then
    echo "$(basename "$0"): no Python at $MLMT_PYTHON (the repository's venv): install it with" \
      "\`bash $MLMT_REPO/scripts/install.sh\` (CPU) or the GPU install (README, GPU install), or set" \
      "MLMT_PYTHON=/path/to/python" >&2
    exit 127
  fi
fi
export MLMT_PYTHON
