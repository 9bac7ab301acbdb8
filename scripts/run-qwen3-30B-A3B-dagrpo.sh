#!/usr/bin/env bash
# DA-GRPO on Qwen3-30B-A3B, multi-node 8xH100: the GRPO launcher with configs/dagrpo.yaml.
#
# Same environment variables and roles as scripts/run-qwen3-30B-A3B.sh. CLOUD_URL names the cloud model's
# OpenAI-compatible endpoint (an SGLang server of a larger model, or a hosted API); the phases, tau and
# eta come from the config (override dagrpo.phases=[...] on the command line).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export METHOD_CONFIG="${METHOD_CONFIG:-configs/dagrpo.yaml}"
if [[ -z "${CLOUD_URL:-}" ]]; then
  echo "error: set CLOUD_URL to the cloud model's OpenAI-compatible endpoint (e.g. http://cloud-host:30000)" >&2
  exit 2
fi
set -- "$@" "dagrpo.cloud_url=${CLOUD_URL}"
exec bash "$HERE/run-qwen3-30B-A3B.sh" "$@"
