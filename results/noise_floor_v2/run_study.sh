#!/usr/bin/env bash
# The noise floor on task family v2 (issue 30, item 2): GRPO from three SFT warm starts (sft.seed = run.seed = 0,
# 1, 2) of configs/grpo_v2.yaml, and each warm start sampled at lower temperatures without RL (the "sharpening"
# baseline: how much of an RL gain a cooler sampler gives for free). The config's RL recipe (64 prompts x 8
# samples per step, lr 3e-5), STEPS RL steps, evaluation on 1026 held-out prompts (114 per level V2-V10; 4 samples
# + greedy) before RL and after it. (32 prompts per step at the same lr moved nothing in 40 steps: README.md.) Run from a git worktree at a fixed commit, one run at a time; a finished run leaves
# OUT/<name>.done and is skipped when the script runs again (the warm starts resume from their cache).
set -euo pipefail
OUT="${OUT:-results/noise_floor_v2/runs}"
SEEDS="${SEEDS:-0 1 2}"
STEPS="${STEPS:-40}"
TEMPS="${TEMPS:-0.7 0.4}"
mkdir -p "$OUT"
DATA=(data.synthetic.n_eval=1026 eval.n_prompts=1026 run.output_dir="$OUT")
run() {  # name, then the run's arguments
  local name=$1; shift
  if [ -f "$OUT/$name.done" ]; then echo "skip $name"; return; fi
  echo "=== $name $(date -u +%FT%TZ)"
  local start; start=$(date +%s)
  if bash scripts/run.sh configs/grpo_v2.yaml run.name="$name" "$@" "${DATA[@]}"; then
    echo "$(( $(date +%s) - start ))" > "$OUT/$name.done"
  else
    echo "FAILED $name (exit $?)"
  fi
}
for s in $SEEDS; do
  run "grpo_s$s" sft.seed="$s" run.seed="$s" train.steps="$STEPS" eval.every="$STEPS"
  for t in $TEMPS; do
    run "sharpen_s${s}_T$t" sft.seed="$s" run.seed="$s" "run.stages=[data,tokenizer,sft,eval]" \
      eval.temperature="$t" eval.greedy=false
  done
done
