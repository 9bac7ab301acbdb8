#!/bin/bash
# the seed-2 warm start judged against the candidate juniors (JUNIORS="hash:steps ...", default the 300- and 600-step ones) on 117 prompts (13 per level), from the worktree /work/wt-tandem (the 300/600 run used this script with its default JUNIORS)
cd /work/wt-tandem
for J in ${JUNIORS:-1a0e22975e7a2dd5:300 160dbf4f51f7508c:600}; do
  H=${J%%:*}; S=${J##*:}
  echo "[$(date -u +%H:%M:%S)] junior $S start"
  PYTHONPATH=/work/wt-tandem OMP_NUM_THREADS=2 /work/main/.venv/bin/python -m slime_ext.tools.eval_checkpoint \
    .cache/slime_ext/warmstart/7fe7ec73e4d30adb/hf eval.n_prompts=117 tandem_axes.prompts=117 \
    --config runs/tandem_study_v2/GRPO-seed2/tandem_grpo-20261128-094206/config.yaml \
    --out /work/prof/juniors/eval_warm_j$S.json --no-progress --tandem-junior .cache/slime_ext/warmstart/$H/hf
  echo "[$(date -u +%H:%M:%S)] junior $S done"
done
