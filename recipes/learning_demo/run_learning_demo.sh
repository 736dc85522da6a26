#!/usr/bin/env bash
# A real model learning: SmolLM2-135M-Instruct as solver and feedback writer on the embedded arithmetic task, trained
# twice with identical settings and seed, the second with the feedback writer frozen (the "fixed feedback" baseline,
# mlmt.hl.freeze=true), both validated greedily on the same 64 held-out problems after every step; then the curve of
# acc@t1 and final accuracy per validation step with ±1 standard error (learning_curve.png, .md, .json in --out).
#
#   bash recipes/learning_demo/run_learning_demo.sh                                  # 2 steps per run (~35 min each)
#   bash recipes/learning_demo/run_learning_demo.sh --out outputs/demo2 --steps 8
#   bash recipes/learning_demo/run_learning_demo.sh --steps 1 mlmt.dataset.n_val=8   # a smoke test of the recipe
#
# Options: --out DIR (default outputs/learning_demo), --steps N (training steps per run), then any key=value override
# for both runs. MLMT_PYTHON picks the interpreter (default: the repository's .venv/bin/python). The runs go one after the other: two at once do not fit in 24 GiB
# (Ray's OOM killer stopped both when their updates met: docs/MEASUREMENTS.md, "A real model learning").
# A rerun with the same arguments continues each run from its latest checkpoint (trainer.resume_mode=auto; a
# checkpoint every 4 steps); a rerun with other arguments into the same --out is refused, so runs never mix.
# The settings and what they gave: recipes/learning_demo/README.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/python.sh"  # MLMT_PYTHON, else the repository's .venv
REPO=$MLMT_REPO
PYTHON=$MLMT_PYTHON
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
# glibc keeps freed update buffers in per-thread heaps: a fixed mmap threshold returns every block over 1 MiB to the
# system when freed, and two arenas bound the rest (the LL update worker kept 7.8 GB after an update without them)
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1048576}" MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"

OUT=outputs/learning_demo
STEPS=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --*) echo "unknown option $1 (options: --out DIR, --steps N, then key=value ...)" >&2; exit 2 ;;
        *) break ;;
    esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# Why each value (README.md): token budgets measured so that few turns are cut, lr 20x the CPU default so that a few
# steps can move a 135M model (not measured), 64 held-out validation problems (default_dataset.is_held_out).
SETTINGS=(
    "trainer.total_training_steps=$STEPS"
    trainer.test_freq=1
    trainer.save_freq=4
    trainer.val_before_train=true
    trainer.resume_mode=auto
    "trainer.logger=[console,tensorboard]"
    data.train_batch_size=4
    data.val_batch_size=64
    data.max_response_length=192
    hl.rollout.response_length=128
    actor_rollout_ref.actor.optim.lr=2e-5
    hl.actor.optim.lr=2e-5
    mlmt.n=2
    mlmt.m=2
    mlmt.dataset.n_train=512
    mlmt.dataset.n_val=64
    mlmt.dataset.max_difficulty=1
    mlmt.dataset.seed=0
    data.seed=0
    "$@"
)

# the same --out with other settings would resume one run's checkpoints under another's: refuse
printf '%s\n' "${SETTINGS[@]}" > "$OUT/settings.new"
if [[ -f "$OUT/settings.txt" ]] && ! cmp -s "$OUT/settings.txt" "$OUT/settings.new"; then
    echo "$OUT holds runs made with other settings (settings.txt vs settings.new): use another --out" >&2
    exit 1
fi
mv "$OUT/settings.new" "$OUT/settings.txt"

train() {  # NAME [extra overrides]: one training run into $OUT/NAME, its console in $OUT/NAME.log
    local name="$1" started
    shift
    started=$(date +%s)
    (cd "$REPO" && "$PYTHON" -m verl.trainer.main_mlmt "${SETTINGS[@]}" "trainer.default_local_dir=$OUT/$name" \
        "trainer.experiment_name=learning_demo_$name" "$@") > "$OUT/$name.log" 2>&1
    echo "$name: $(( $(date +%s) - started )) s (load: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/wall_times.txt"
}

train mlmt
train frozen_hl mlmt.hl.freeze=true

"$PYTHON" -m agent_system.comparisons.learning_curve --out "$OUT" --run "mlmt=$OUT/mlmt" --run "frozen_hl=$OUT/frozen_hl" \
    --title "SmolLM2-135M at both levels vs HL frozen: 64 held-out problems"
echo "curve: $OUT/learning_curve.png, table: $OUT/learning_curve.md"
