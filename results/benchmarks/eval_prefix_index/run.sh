#!/bin/bash
# solo evaluation (1026 held-out prompts x 4 at T = 1 + greedy) of the seed-2 warm start, 056a109 (scan) then 8496a75 (trie)
for T in /tmp/before /work/wt-tandem; do
  cd $T
  echo "[$(date -u +%H:%M:%S)] $T $(git rev-parse --short HEAD) start"
  OMP_NUM_THREADS=2 /work/main/.venv/bin/python -m slime_ext.tools.eval_checkpoint .cache/slime_ext/warmstart/7fe7ec73e4d30adb/hf \
    --config runs/tandem_study_v2/GRPO-seed2/tandem_grpo-20261128-094206/config.yaml --no-progress \
    --out /work/prof/evalspeed/eval_$(git rev-parse --short HEAD).json 2>&1 | grep -v "Loading weights" | tail -8
  echo "[$(date -u +%H:%M:%S)] $T done"
done
