#!/usr/bin/env bash
cd /work/wt-new
echo "[job] head $(git rev-parse --short HEAD) start $(date -u +%FT%TZ)"
start=$(date +%s)
PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
  run.cache_dir=/tmp/job3head/cache run.output_dir=/tmp/job3head/runs > /tmp/jobs/head.log 2>&1
echo "[job] head rc=$? wall_s=$(( $(date +%s) - start )) end $(date -u +%FT%TZ)"
