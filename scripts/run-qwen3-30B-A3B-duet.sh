#!/usr/bin/env bash
# DUET on Qwen3-30B-A3B, multi-node 8xH100: the GRPO launcher with configs/duet.yaml.
#
# Same environment variables and roles as scripts/run-qwen3-30B-A3B.sh (head / worker, HF_CKPT, RUN_DIR,
# --dry-run ...). Set the per-step budget with duet.budget_fraction=F (of full GRPO) or
# duet.budget_tokens=N. The gate sampler runs inside SGLang through our custom logit processor, so the
# engines start with --enable-custom-logit-processor --disable-overlap-schedule (the launcher adds both).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export METHOD_CONFIG="${METHOD_CONFIG:-configs/duet.yaml}"
exec bash "$HERE/run-qwen3-30B-A3B.sh" "$@"
