#!/usr/bin/env bash
# Both levels learning in a few minutes on a CPU: the relay task (agent_system/demos/relay.py: the feedback writer knows
# each problem's two-digit code, the solver does not and can only copy it from the feedback), two tiny models warmed up
# by supervised fine-tuning, then trained twice with identical settings and seed: MLMT, and the null control (the
# feedback writer's GRPO on its rewards shuffled within each group, agent_system/demos/permuted_grpo.py). Then the
# useful-feedback rate, R3 and the solver's copy rate per step of both runs (relay_curve.png, .md, .json in --out).
#
#   bash recipes/relay_demo/run_relay_demo.sh                                   # 14 steps per run, seed 0
#   bash recipes/relay_demo/run_relay_demo.sh --out outputs/relay_seed1 --seed 1
#   bash recipes/relay_demo/run_relay_demo.sh --steps 3                         # a smoke test of the recipe
#
# Options: --out DIR (default outputs/relay_demo), --steps N (training steps per run, default 14), --seed S (the
# task's golds, both warm-ups and the data order; default 0), then any key=value override for both runs. The task is
# built once per seed into --out/task_seedS (a rerun skips the warm-ups); the runs are redone on every call, one after
# the other (mlmt/, permuted/, their consoles mlmt.log and permuted.log). MLMT_PYTHON picks the interpreter (default:
# the repository's .venv/bin/python). What it shows and how to read it: recipes/relay_demo/README.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/python.sh"  # MLMT_PYTHON, else the repository's .venv
REPO=$MLMT_REPO
PYTHON=$MLMT_PYTHON
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

OUT=outputs/relay_demo
STEPS=14
SEED=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --*) echo "unknown option $1 (options: --out DIR, --steps N, --seed S, then key=value ...)" >&2; exit 2 ;;
        *) break ;;
    esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
TASK="$OUT/task_seed$SEED"
demo() { (cd "$REPO" && "$PYTHON" -m agent_system.demos.relay_demo "$@"); }

started=$(date +%s)
demo build --task "$TASK" --seed "$SEED"
echo "task of seed $SEED: $(( $(date +%s) - started )) s" | tee "$OUT/wall_times.txt"

train() {  # NAME [--control]: one training run into $OUT/NAME, its console in $OUT/NAME.log
    local name="$1" began
    shift
    began=$(date +%s)
    echo "training $name ($STEPS steps; console: $OUT/$name.log)"
    demo train --task "$TASK" --run "$OUT/$name" --steps "$STEPS" --seed "$SEED" "$@"
    echo "$name: $(( $(date +%s) - began )) s (load: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/wall_times.txt"
}

train mlmt "$@"
train permuted --control "$@"

demo curve --out "$OUT" --run "mlmt=$OUT/mlmt" --run "permuted=$OUT/permuted" \
    --title "relay task, seed $SEED: MLMT vs the null control (HL rewards shuffled within groups)"
echo "all: $(( $(date +%s) - started )) s" | tee -a "$OUT/wall_times.txt"
echo "curve: $OUT/relay_curve.png, table: $OUT/relay_curve.md"
