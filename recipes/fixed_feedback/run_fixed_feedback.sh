#!/usr/bin/env bash
# Fixed feedback (the paper's "fixed feedback" baseline): the feedback writer (HL) is frozen and writes feedback with
# its initial weights; the solver (LL) trains on every step. This runs the seed's script under its own name,
# mlmt-configs/math/HLF_LLT_RR_1_1.sh, which holds the settings (recipes/fixed_feedback/README.md).
#
#   bash recipes/fixed_feedback/run_fixed_feedback.sh [key=value ...]                         # a GPU node
#   sbatch mlmt-configs/math/submit_mlmt.sbatch recipes/fixed_feedback/run_fixed_feedback.sh  # on Slurm
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../mlmt-configs/math/HLF_LLT_RR_1_1.sh" "$@"
