#!/usr/bin/env bash
# The main job: bash scripts/run.sh [CONFIG.yaml] [key=value ...]   (default config: configs/grpo.yaml)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
unset PYTHONDONTWRITEBYTECODE  # the driver and its Ray workers reuse the bytecode of their imports (setup.sh)
exec "${VENV:-$ROOT/.venv}/bin/python" -m slime_ext.orchestration.driver "$@"
