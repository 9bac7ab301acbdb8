#!/usr/bin/env bash
# 556M TP2/EP2 delta sync before / after counting both sides of a pair against the bucket (2f9a850), tensor beside; alone on the machine
# /work/wt-before: a worktree at 84dd619 (the per-shard copy, pairs bounded on the weights alone); /work/wt-after: at 2f9a850
set -x
cd /work/wt-after
export OMP_NUM_THREADS=1
B=benchmarks/weight_sync_scaling.py
date -u
.venv/bin/python $B --out /work/ws_pair/before --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths delta --repeats 2 \
  --label before_pair_bound --src /work/wt-before
date -u
.venv/bin/python $B --out /work/ws_pair/after --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths delta tensor --repeats 2 \
  --label after_pair_bound
date -u
# second part: the paths in the other order (tensor first, then delta), after and before
set -x
cd /work/wt-after
export OMP_NUM_THREADS=1
B=benchmarks/weight_sync_scaling.py
date -u
.venv/bin/python $B --out /work/ws_pair/after_order2 --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths tensor delta --repeats 2 \
  --label after_pair_bound_tensor_first
date -u
.venv/bin/python $B --out /work/ws_pair/before_order2 --work /tmp/ws_work --sizes 560M --layouts tp2ep2 --paths tensor delta --repeats 2 \
  --label before_pair_bound_tensor_first --src /work/wt-before
date -u
