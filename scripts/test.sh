#!/usr/bin/env bash
# Run the test suite in .venv (created/updated first). Default: everything except slow end-to-end
# checks and GPU-only tests. `--slow` adds the slow ones; any other arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh  # on a machine without CUDA it also installs the sglang package (no deps) the tests use
MARK="not slow and not gpu"
ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--slow" ]; then MARK="not gpu"; else ARGS+=("$arg"); fi
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Let Python cache the bytecode of what the tests import (setup installs without compiling every module): with
# PYTHONDONTWRITEBYTECODE set, each of the suite's hundreds of processes would compile its imports again.
unset PYTHONDONTWRITEBYTECODE
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest -m "$MARK" "${ARGS[@]}"
