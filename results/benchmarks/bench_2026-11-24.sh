#!/usr/bin/env bash
cd /work/main
export OMP_NUM_THREADS=1
echo "[bench] start $(date -u +%FT%TZ)"
.venv/bin/python benchmarks/decode.py --repeats 3 --out results/benchmarks 2>&1 | grep "\[bench\]"
.venv/bin/python benchmarks/train_step.py --out results/benchmarks 2>&1 | grep "\[bench\]"
.venv/bin/python benchmarks/tandem_rollout.py --repeats 3 --out results/benchmarks 2>&1 | grep -i "bench\|ratio"
.venv/bin/python benchmarks/profile_phases.py --out results/profile 2>&1 | grep "\[profile\]"
echo "[bench] end $(date -u +%FT%TZ)"
