#!/usr/bin/env bash
# Create (or reuse) .venv and install the project into it. Safe to re-run: a stamp of pyproject.toml
# and the extras skips the pip step when nothing changed (the install is editable, so code edits
# need no reinstall).
#
# torch is installed FIRST and pinned (2.13.0): an unpinned torch pulls several GB of CUDA wheels on a
# CPU machine, and sglang's torch pin must match it on GPU machines.
# Env: VENV (default .venv), PYTHON (default python3), TORCH_INDEX_URL (optional extra pip index for
# torch), SLIME_SKIP_GPU_EXTRA=1 (CUDA machines: do not install sglang / transformer-engine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"

log() { printf '[setup] %s\n' "$*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAS_CUDA=1
else
  HAS_CUDA=0
fi
EXTRAS="test"
if [ "$HAS_CUDA" = 1 ] && [ "${SLIME_SKIP_GPU_EXTRA:-0}" != 1 ]; then
  EXTRAS="test,gpu"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
# --no-compile: pip would byte-compile every module of every package (torch alone: ~30 s of a 2-core machine's
# setup); Python compiles the modules a process imports, once, where it may write bytecode (scripts/test.sh lets it)
INSTALL=(install -q --no-compile)

# Best effort: the code verifier's sandbox uses bubblewrap (docs/rewards.md). Never fails setup.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
      && { apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
           || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; }; then
    log "installed bubblewrap for the code sandbox"
  else
    log "bubblewrap (bwrap) is not installed: the code verifier falls back to a weaker sandbox (see docs/rewards.md)"
  fi
fi

# On a machine without CUDA the real sglang package goes in without its dependencies (it pins a CUDA torch):
# the tensor and distributed weight-sync paths call its serializer, flattened buckets and rendezvous, in the
# driver's trainer ranks as in the tests (its own stamp skips it when current).
cpu_sglang() {
  if [ "$HAS_CUDA" = 0 ]; then VENV="$VENV" bash "$ROOT/scripts/install_sglang_cpu.sh"; fi
}

STAMP="$VENV/.slime_ext_install_stamp"
WANT="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16) extras=$EXTRAS cuda=$HAS_CUDA torch=$TORCH_VERSION"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import slime_ext, torch" >/dev/null 2>&1; then
  log "environment up to date ($VENV)"
  cpu_sglang
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" >/dev/null 2>&1; then
  log "installing torch==$TORCH_VERSION first ($([ "$HAS_CUDA" = 1 ] && echo CUDA || echo CPU) build)"
  TORCH_ARGS=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then TORCH_ARGS+=(--extra-index-url "$TORCH_INDEX_URL"); fi
  "${PIP[@]}" "${INSTALL[@]}" "${TORCH_ARGS[@]}" "torch==$TORCH_VERSION"
  if [ "$HAS_CUDA" = 0 ] && "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"; then
    log "warning: a CUDA build of torch was installed on a machine without a GPU;" \
        "set TORCH_INDEX_URL to a CPU wheel index to avoid the download"
  fi
fi

log "installing the project (extras: $EXTRAS)"
"${PIP[@]}" "${INSTALL[@]}" -e "$ROOT[$EXTRAS]"
if [ "$HAS_CUDA" = 0 ] && "$PY" -c "import transformer_engine" >/dev/null 2>&1; then
  log "error: transformer-engine is installed on a machine without CUDA; it breaks 'import megatron.core'."
  log "remove it: $PY -m pip uninstall -y transformer-engine transformer-engine-torch"
  exit 1
fi
echo "$WANT" > "$STAMP"
cpu_sglang
log "ready: $("$PY" -c 'import torch, megatron.core, ray, transformers; print(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, ray {ray.__version__}, transformers {transformers.__version__}")')"
