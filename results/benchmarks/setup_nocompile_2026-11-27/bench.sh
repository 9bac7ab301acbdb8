#!/usr/bin/env bash
# Side by side: the project's setup into a fresh venv with pip compiling every module (today), and with
# --no-compile (Python compiles what is imported, once, when PYTHONDONTWRITEBYTECODE is unset).
set -uo pipefail
ROOT=/work/main
cd /work/setupbench
for mode in compile nocompile; do
  rm -rf venv_$mode
  python3 -m venv venv_$mode
  PIP=(venv_$mode/bin/python -m pip --disable-pip-version-check)
  FLAG=(); [ $mode = nocompile ] && FLAG=(--no-compile)
  s=$(date +%s.%N)
  "${PIP[@]}" install -q "${FLAG[@]}" torch==2.13.0
  t=$(date +%s.%N)
  "${PIP[@]}" install -q "${FLAG[@]}" -e "$ROOT[test]"
  u=$(date +%s.%N)
  echo "$mode torch $(echo "$t - $s" | bc) s, project $(echo "$u - $t" | bc) s, total $(echo "$u - $s" | bc) s"
done
IMP="import torch, megatron.core, ray, transformers, slime_ext.orchestration.training_job"
for i in 1 2; do
  s=$(date +%s.%N); PYTHONDONTWRITEBYTECODE=1 venv_compile/bin/python -c "$IMP"; t=$(date +%s.%N)
  echo "compile venv, PYTHONDONTWRITEBYTECODE=1, import $i: $(echo "$t - $s" | bc) s"
done
for i in 1 2 3; do
  s=$(date +%s.%N); env -u PYTHONDONTWRITEBYTECODE venv_nocompile/bin/python -c "$IMP"; t=$(date +%s.%N)
  echo "nocompile venv, bytecode cached on import, import $i: $(echo "$t - $s" | bc) s"
done
