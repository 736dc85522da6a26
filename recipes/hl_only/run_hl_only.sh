#!/usr/bin/env bash
# HL-only: the solver (LL) is frozen and the feedback writer (HL) trains on every step with REINFORCE on R3. This runs
# the seed's script under its own name, mlmt-configs/math/HLT_LLF_RR_1_1.sh, which holds the settings
# (recipes/hl_only/README.md).
#
#   bash recipes/hl_only/run_hl_only.sh [key=value ...]                         # a GPU node
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/hl_only/run_hl_only.sh  # on Slurm
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/math/HLT_LLF_RR_1_1.sh" "$@"
