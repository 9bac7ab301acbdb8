#!/usr/bin/env bash
# The default job at the previous commit, then at the commit with two trainer ranks (one after the other).
for side in old new; do
  cd /work/wt-$side
  echo "[pair] $side $(git rev-parse --short HEAD) start $(date -u +%FT%TZ)"
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=/tmp/job3$side/cache run.output_dir=/tmp/job3$side/runs > /tmp/jobs3/$side.log 2>&1
  rc=$?
  echo "[pair] $side rc=$rc wall_s=$(( $(date +%s) - start )) end $(date -u +%FT%TZ)"
done
