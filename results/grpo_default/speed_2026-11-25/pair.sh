#!/usr/bin/env bash
# The default job at the previous commit (default recipe), then at this session's commit with sft.steps=500.
for side in old new; do
  cd /work/wt-$side
  extra=""
  [ $side = new ] && extra="sft.steps=500"
  echo "[pair] $side $(git rev-parse --short HEAD) $extra start $(date -u +%FT%TZ)"
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=/tmp/job2$side/cache run.output_dir=/tmp/job2$side/runs $extra > /tmp/jobs/$side.log 2>&1
  rc=$?
  echo "[pair] $side rc=$rc wall_s=$(( $(date +%s) - start )) end $(date -u +%FT%TZ)"
done
