#!/usr/bin/env bash
# 556M delta sync before / after the per-shard copy (b3db285), then disk and TP1 at the new commit; alone on the machine
set -x
cd /work/wt-bench-after
export OMP_NUM_THREADS=1
B=benchmarks/weight_sync_scaling.py
.venv/bin/python $B --out /work/ws_shard/before --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths delta --repeats 2 \
  --label before_shard_copy --src /work/wt-bench-before
.venv/bin/python $B --out /work/ws_shard/after --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths delta tensor --repeats 2 \
  --label after_shard_copy
.venv/bin/python $B --out /work/ws_shard/after_rest --work /tmp/ws_work --sizes 560M --layouts tp2ep2 tp1ep1 --paths disk delta --repeats 2 \
  --label after_shard_copy_rest
date
