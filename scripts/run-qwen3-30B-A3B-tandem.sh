#!/usr/bin/env bash
# Tandem RL on Qwen3-30B-A3B, multi-node 8xH100: the GRPO launcher with configs/tandem.yaml.
#
# Same environment variables and roles as scripts/run-qwen3-30B-A3B.sh (head / worker, HF_CKPT, RUN_DIR,
# --dry-run ...). The junior is a frozen copy of HF_CKPT unless JUNIOR_CKPT names another checkpoint
# with the same vocabulary. Each SGLang engine then serves the pair (sglang_patches.tandem_model): the
# dry-run plan counts two models' weights and a KV pool of 2 x 48 layers per engine, so check its
# memory lines before launching.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export METHOD_CONFIG="${METHOD_CONFIG:-configs/tandem.yaml}"
if [[ -n "${JUNIOR_CKPT:-}" ]]; then
  set -- "$@" "tandem.junior_path=${JUNIOR_CKPT}"
fi
exec bash "$HERE/run-qwen3-30B-A3B.sh" "$@"
