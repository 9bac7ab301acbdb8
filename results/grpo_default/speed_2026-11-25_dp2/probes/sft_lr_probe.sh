#!/bin/bash
# SFT-only probes: warm start quality at 500 steps with a higher peak lr
cd /work/wt-sft
for lr in 2.0e-3 1.5e-3; do
  d=/tmp/sftlr/lr$lr
  start=$(date +%s)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m slime_ext.orchestration.driver configs/grpo.yaml \
    run.cache_dir=$d/cache run.output_dir=$d/runs sft.steps=500 sft.lr=$lr \
    'run.stages=[data,tokenizer,check_references,sft,eval]' > $d.log 2>&1
  echo "lr=$lr rc=$? wall=$(( $(date +%s) - start ))s" >> /tmp/sftlr/done.txt
done
