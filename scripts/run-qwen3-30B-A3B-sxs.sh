#!/usr/bin/env bash
# SxS on Qwen3-30B-A3B, multi-node 8xH100: stage 1 SFT on interleaved think/speak data, stage 2 RL on the
# visible answer (the GRPO launcher with configs/sxs_sft.yaml, then configs/sxs_rl.yaml).
#
# Same environment variables and roles as scripts/run-qwen3-30B-A3B.sh. STAGES=sft, rl or "sft rl"
# (default). For real data, build the interleaved JSONL first with
#   python -m slime_ext.methods.sxs.build_data --input triples.jsonl --oracle judge --judge-url http://<sglang>:30000 --out sxs.jsonl
# and pass data.source=jsonl data.train_path=sxs.jsonl (answers in the 'solution' field). The RL stage
# reuses the SFT warm start from the cache (same content hash) and keeps it as its KL reference.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for stage in ${STAGES:-sft rl}; do
  case "$stage" in
    sft) METHOD_CONFIG=configs/sxs_sft.yaml bash "$HERE/run-qwen3-30B-A3B.sh" "$@" ;;
    rl) METHOD_CONFIG=configs/sxs_rl.yaml bash "$HERE/run-qwen3-30B-A3B.sh" "$@" ;;
    *) echo "[run-qwen3-30B-A3B-sxs] error: unknown stage '$stage' (use sft, rl)" >&2; exit 2 ;;
  esac
done
