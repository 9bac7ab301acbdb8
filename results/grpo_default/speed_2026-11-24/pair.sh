#!/usr/bin/env bash
# The default job at the previous commit, then at the new one, one after the other on this machine.
for side in old new; do
  cd /work/wt-$side
  echo "[pair] $side $(git rev-parse --short HEAD) start $(date -u +%FT%TZ)"
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=/tmp/job$side/cache run.output_dir=/tmp/job$side/runs > /tmp/jobs/$side.log 2>&1
  rc=$?
  echo "[pair] $side rc=$rc wall_s=$(( $(date +%s) - start )) end $(date -u +%FT%TZ)"
done
