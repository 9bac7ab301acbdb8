#!/usr/bin/env bash
# Usage: behaviour_check.sh TREE LABEL  -> /tmp/beh/LABEL/<config>/{metrics,sft}.jsonl (timing keys dropped)
# TREE: a checkout (git worktree) of the commit to run; the 'before' run used the previous entry point
# (python -m slime_ext.main), the 'after' run python -m slime_ext.orchestration.driver (this file).
set -u
TREE=$1; LABEL=$2; shift 2
CONFIGS=${CONFIGS:-"grpo dapo tandem tandem_klreg duet duet_tandem sxs_rl dagrpo collab_grpo"}
PY=/work/main/.venv/bin/python
export OMP_NUM_THREADS=1 PYTHONPATH=$TREE
for c in $CONFIGS; do
  out=/tmp/beh/$LABEL/$c; rm -rf $out; mkdir -p $out
  extra=()
  if [ $c != grpo ]; then extra+=(rollout.prompts_per_step=8 rollout.n_samples_per_prompt=4); fi
  if [ $c = dagrpo ] || [ $c = collab_grpo ]; then
    extra+=("dagrpo.phases=[{name: easy, levels: [L1], steps: 2, tau: 0.2, step_limit: 3}, {name: hard, levels: [L4], steps: 1, tau: 0.2, step_limit: 6}]")
  fi
  if [ $c = duet ] || [ $c = duet_tandem ]; then extra+=(rollout.prompt_pool=64); fi
  (cd $TREE && $PY -m slime_ext.orchestration.driver configs/$c.yaml run.output_dir=$out/runs run.cache_dir=$out/cache \
     data.synthetic.n_train=2000 data.synthetic.n_eval=64 tokenizer.n_training_texts=1000 \
     sft.steps=20 sft.batch_size=32 train.steps=3 "run.stages=[data,tokenizer,sft,rl]" "${extra[@]}" > $out/log.txt 2>&1)
  echo "$c rc=$?"
  $PY - "$out" <<'PYEOF'
import json, sys, glob, pathlib
out = pathlib.Path(sys.argv[1])
drop = lambda k: k.startswith(("time/", "perf/", "memory/")) or k in ("seconds",)
for name, pat in (("metrics", "runs/*/metrics.jsonl"), ("sft", "cache/warmstart/*/sft_metrics.jsonl")):
    files = glob.glob(str(out / pat))
    rows = [json.loads(l) for f in files for l in open(f)]
    (out / f"{name}.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if not drop(k)}, sort_keys=True) + "\n" for r in rows))
    print(name, len(rows))
PYEOF
done
