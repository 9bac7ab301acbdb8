#!/bin/bash
cd /work/wt-sft
for dp in 2 1; do
  d=/tmp/sftlr/dp$dp
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=$d/cache run.output_dir=$d/runs_rl sft.steps=80 train.parallel.data_parallel_size=$dp train.steps=5 \
    'run.stages=[data,tokenizer,check_references,sft,rl]' > $d.rl.log 2>&1
  echo "dp=$dp rc=$? wall=$(( $(date +%s) - start ))s" >> /tmp/sftlr/dprl_done.txt
done
