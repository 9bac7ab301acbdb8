#!/usr/bin/env bash
# grpo_quick through two engine servers: the commit before the change (disk sync) and this change with each
# sync path, one after the other on this machine; the three after-runs share one SFT cache (same warm start).
set -x
export OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
cd /tmp/wt_before && PYTHONPATH=/tmp/wt_before /usr/bin/time -v $PY -m slime_ext.orchestration.driver configs/grpo_quick.yaml \
  rollout.engine=sglang run.output_dir=/tmp/gq/before/runs run.cache_dir=/tmp/gq/before/cache > /tmp/gq/before.log 2>&1
for sync in disk tensor distributed; do
  cd /tmp/wt_final && PYTHONPATH=/tmp/wt_final /usr/bin/time -v $PY -m slime_ext.orchestration.driver configs/grpo_quick.yaml \
    rollout.engine=sglang sglang.weight_sync=$sync run.output_dir=/tmp/gq/$sync/runs run.cache_dir=/tmp/gq/after_cache > /tmp/gq/$sync.log 2>&1
done
echo GQDONE
cd /tmp/wt_final
$PY benchmarks/weight_sync_scaling.py --out /tmp/wsbench/final --work /tmp/wsbench/work --label after --repeats 2
cp /tmp/wsbench/out/weight_sync_before.json /tmp/wsbench/final/
$PY benchmarks/weight_sync_scaling.py --compare /tmp/wsbench/final/weight_sync_before.json /tmp/wsbench/final/weight_sync_after.json --out /tmp/wsbench/final
echo BENCHDONE
