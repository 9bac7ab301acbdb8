#!/usr/bin/env bash
# One recipe pilot on task family v2, paired with sharpening at the same temperature: GRPO from the seed's warm
# start (configs/grpo_v2.yaml; the SFT is regenerated when not in the cache: 1200 steps, bit-reproducible at one
# commit: README "Is a warm start reproducible?"), then the warm start and the trained model each sampled at
# T = COOL without greedy, then compare_pilot.py: trained (T = 1) vs warm (T = 1 and T = COOL) and trained at
# COOL vs warm at COOL (does RL add anything on top of sharpening). Run from a git worktree at a fixed commit,
# alone on the machine; each finished part leaves a marker and is skipped when the script runs again.
#   bash results/noise_floor_v2/run_pilot.sh NAME SEED STEPS [key=value ...]    # e.g. pilot_kl 0 40 train.kl_coef=0.01
# Env: OUT (default results/noise_floor_v2/<NAME>), WORK (the run directories; default runs_pilot), COOL (0.4).
set -euo pipefail
NAME=$1; SEED=$2; STEPS=$3; shift 3
OUT="${OUT:-results/noise_floor_v2/$NAME}"
WORK="${WORK:-runs_pilot}"
COOL="${COOL:-0.4}"
PY="${VENV:-.venv}/bin/python"
mkdir -p "$OUT" "$WORK"
log() { printf '[pilot %s] %s\n' "$(date -u +%T)" "$*" >&2; }
DATA=(data.synthetic.n_eval=1026 eval.n_prompts=1026)

if [ ! -f "$OUT/.rl.done" ]; then
  log "GRPO: seed $SEED, $STEPS steps, overrides: $*"
  bash scripts/run.sh configs/grpo_v2.yaml run.name="$NAME" sft.seed="$SEED" run.seed="$SEED" train.steps="$STEPS" \
    run.output_dir="$WORK" "${DATA[@]}" "$@"
  ls -d "$WORK/$NAME"-* | tail -1 > "$OUT/.rl.done"
fi
RUN=$(cat "$OUT/.rl.done")
stage() { "$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['stages'][sys.argv[2]][sys.argv[3]])" \
          "$RUN/summary.json" "$1" "$2"; }
WARM=$(stage sft warm_start)   # the run's own warm start (the cache's hf/)
FINAL=$(stage rl final_weights)
evaluate() {  # label, checkpoint
  if [ -f "$OUT/.$1.done" ]; then return; fi
  log "evaluating $2 at T = $COOL ($1)"
  "$PY" -m slime_ext.tools.eval_checkpoint "$2" --config "$RUN/config.yaml" eval.temperature="$COOL" \
    eval.greedy=false --out "$WORK/$NAME-$1"
  touch "$OUT/.$1.done"
}
evaluate "warm_T$COOL" "$WARM"
evaluate "final_T$COOL" "$FINAL"
"$PY" - "$RUN" "$OUT" <<'PYEOF'
import sys
from slime_ext.studies import keep_run_files
keep_run_files(sys.argv[1], sys.argv[2])
PYEOF
for pair in "warm:warm_start" "final:final"; do  # evaluation label : the kept files' name
  src="$WORK/$NAME-${pair%%:*}_T$COOL" kept="$OUT/${pair#*:}_T$COOL"
  gzip -c "$src/eval.records.jsonl" > "$kept.records.jsonl.gz"
  cp "$src/eval.json" "$kept.json"
done
"$PY" results/noise_floor_v2/compare_pilot.py "$OUT" --sharpen "$COOL=$OUT/warm_start_T$COOL.records.jsonl.gz" \
  --cooled "$COOL=$OUT/final_T$COOL.records.jsonl.gz"
log "done: $OUT"
