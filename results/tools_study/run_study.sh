#!/usr/bin/env bash
# The tools study (issue 31): GRPO with the calculator (configs/grpo_tools.yaml) against the same model without
# tools (configs/grpo_tools_notools.yaml), 3 RL seeds per arm from one warm start per arm (sft.seed=0), paired by
# seed. Sized to a 2-core machine: 32 prompts x 8 samples per step, 30 steps, eval on 1024 held-out prompts
# (4 samples + greedy) at steps 0, 15 and 30. Run from a git worktree at a fixed commit, one run at a time.
set -euo pipefail
OUT="${OUT:-results/tools_study/runs}"
SEEDS="${SEEDS:-0 1 2}"
COMMON=(sft.seed=0 rollout.prompts_per_step=32 train.steps=30 eval.n_prompts=1024
        data.synthetic.n_eval=1024 run.output_dir="$OUT")
for s in $SEEDS; do
  for arm in tools notools; do
    cfg=configs/grpo_tools.yaml; [ "$arm" = notools ] && cfg=configs/grpo_tools_notools.yaml
    name="${arm}_s$s"
    if [ -f "$OUT/$name.done" ]; then echo "skip $name"; continue; fi
    echo "=== $name $(date -u +%FT%TZ)"
    start=$(date +%s)
    # a failed run is reported and the series goes on; run the script again to redo it (done runs are skipped,
    # the warm start resumes from its cache)
    if bash scripts/run.sh "$cfg" run.seed="$s" run.name="$name" "${COMMON[@]}"; then
      echo "$(( $(date +%s) - start ))" > "$OUT/$name.done"
    else
      echo "FAILED $name (exit $?)"
    fi
  done
done
