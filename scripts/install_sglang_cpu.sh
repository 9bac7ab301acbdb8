#!/usr/bin/env bash
# The real sglang package on CPU machines: the weight-sync paths call its serializer, flattened buckets
# and process-group rendezvous, and contract tests build its own Qwen3-MoE model to load what our export
# sends. sglang pins a CUDA torch and CUDA-only kernels, so install its wheel WITHOUT dependencies, plus
# the pure-Python packages (and triton, a plain wheel) that `import sglang.srt.sampling.custom_logit_processor`,
# `sglang.srt.managers.io_struct` and `sglang.srt.models.qwen3_moe` need (the last also needs stand-ins for
# torchvision and sgl_kernel, which only tests provide: tests/sglang_model_host.py). Every package is installed with --no-deps so nothing can
# replace the pinned CPU torch. Safe to re-run (stamp). Failure is not fatal: the contract tests then
# skip and print why, and a run that needs it stops before any work, naming this script.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
SGLANG_VERSION="0.5.21"
PACKAGES=(
  "sglang==$SGLANG_VERSION"
  orjson psutil pybase64 triton pillow starlette anyio sniffio msgspec pyzmq ipython traitlets pygments
  aiohttp aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs dill
  typing_inspection httpx2 httpcore2 truststore h11
  einops openai distro jiter compressed-tensors loguru gguf partial-json-parser sentencepiece
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
