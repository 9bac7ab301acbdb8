#!/usr/bin/env bash
# Contract tests import the real sglang package on CPU machines. sglang pins a CUDA torch and
# CUDA-only kernels, so install its wheel WITHOUT dependencies, plus the pure-Python packages (and
# triton, a plain wheel) that `import sglang.srt.sampling.custom_logit_processor` and
# `sglang.srt.managers.io_struct` need. Every package is installed with --no-deps so nothing can
# replace the pinned CPU torch. Safe to re-run (stamp). Failure is not fatal: the contract tests then
# skip and print why.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
SGLANG_VERSION="0.5.21"
PACKAGES=(
  "sglang==$SGLANG_VERSION"
  orjson psutil pybase64 triton pillow starlette anyio sniffio msgspec pyzmq ipython traitlets pygments
  aiohttp aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs dill
  typing_inspection httpx2 httpcore2 truststore h11
)
STAMP="$(dirname "$PY")/../.sglang_cpu_stamp"
WANT="$SGLANG_VERSION ${PACKAGES[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
echo "[setup] installing sglang $SGLANG_VERSION for CPU contract tests (--no-deps)" >&2
if "$PY" -m pip install -q --no-compile --disable-pip-version-check --no-deps "${PACKAGES[@]}"; then
  echo "$WANT" > "$STAMP"
else
  echo "[setup] warning: sglang contract-test packages did not install; those tests will skip" >&2
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" || {
  echo "[setup] error: the sglang install changed torch; rebuild .venv" >&2; exit 1; }
