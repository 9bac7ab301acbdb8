#!/bin/bash
cd /work/wt-new
for t in 2 1; do
  d=/tmp/sftlr/thr$t
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=/tmp/sftlr/thrcache run.output_dir=$d/runs sft.steps=80 rollout.threads=$t train.steps=6 \
    'run.stages=[data,tokenizer,check_references,sft,rl]' > $d.log 2>&1
  echo "t=$t rc=$? wall=$(( $(date +%s) - start ))s" >> /tmp/sftlr/thr_done.txt
done
