#!/usr/bin/env bash
# On-policy distillation of Qwen3-30B-A3B from a bigger Qwen3 teacher on engine servers of its own: the GRPO
# launcher with configs/opd.yaml, over NNODES (default 2) 8xH100 nodes.
#
# Same environment variables and roles as scripts/run-qwen3-30B-A3B.sh (head / worker, HF_CKPT, RUN_DIR,
# --dry-run ...), plus TEACHER_CKPT (the teacher's HF checkpoint; it must share the student's tokenizer, as
# the Qwen3 family does), TEACHER_ENGINES (default 2) and TEACHER_TP (default 4): the teacher's SGLang servers,
# on TEACHER_ENGINES x TEACHER_TP GPUs of their own (the last node's, by default all of it), and
# TEACHER_MODEL_CONFIG (the teacher's architecture for a plan made where TEACHER_CKPT is absent; default
# configs/models/qwen3-32b.yaml). The student's trainer and rollout engines take the other nodes, colocated as
# in the GRPO launcher. The dry-run plan prints the teacher's servers and their memory per GPU.
#
#   check:  bash scripts/run-qwen3-30B-A3B-opd.sh --dry-run [key=value ...]
#   head:   NNODES=2 HF_CKPT=/ckpt/Qwen3-30B-A3B TEACHER_CKPT=/ckpt/Qwen3-32B bash scripts/run-qwen3-30B-A3B-opd.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export METHOD_CONFIG="${METHOD_CONFIG:-configs/opd.yaml}"
export NNODES="${NNODES:-2}"
TEACHER_ENGINES="${TEACHER_ENGINES:-2}"
TEACHER_TP="${TEACHER_TP:-4}"
TEACHER_MODEL_CONFIG="${TEACHER_MODEL_CONFIG:-$HERE/../configs/models/qwen3-32b.yaml}"
for name in TEACHER_ENGINES TEACHER_TP; do
  [[ "${!name}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $name must be a positive integer, got '${!name}'" >&2; exit 2; }
done
dry=0
for arg in "$@"; do [[ "$arg" == --dry-run ]] && dry=1; done
[[ "${DRY_RUN:-0}" == 1 ]] && dry=1
if [[ -z "${TEACHER_CKPT:-}" ]]; then
  if [[ "$dry" != 1 ]]; then
    echo "error: set TEACHER_CKPT to the teacher's HF checkpoint (e.g. /ckpt/Qwen3-32B)" >&2
    exit 2
  fi
  TEACHER_CKPT="/path/to/Qwen3-32B"
  echo "[run-qwen3-30B-A3B-opd] warning: TEACHER_CKPT is not set; the dry run uses the placeholder $TEACHER_CKPT" >&2
fi
export SCORING_GPUS=$(( TEACHER_ENGINES * TEACHER_TP ))
set -- "$@" "opd.teacher=${TEACHER_CKPT}" "opd.teacher_engines=${TEACHER_ENGINES}" \
  "opd.teacher_tp_size=${TEACHER_TP}" "opd.teacher_placement=own" \
  "opd.teacher_model_config=$(cd "$(dirname "$TEACHER_MODEL_CONFIG")" && pwd)/$(basename "$TEACHER_MODEL_CONFIG")"
exec bash "$HERE/run-qwen3-30B-A3B.sh" "$@"
