# usage: ident_fix.sh SIDE TREE : dapo (128-sample batches) and the DA-GRPO family (one 3-step phase)
side=$1; tree=$2
out=/tmp/ident29b_$side
cd $tree
common=('data.synthetic.train_levels=[L0]' 'data.synthetic.eval_levels=[L0]' data.synthetic.n_train=2000 data.synthetic.n_eval=64 sft.steps=300 sft.batch_size=32 rollout.n_samples_per_prompt=8 train.steps=3 'run.stages=[data,tokenizer,sft,rl]' run.cache_dir=$out/cache)
OMP_NUM_THREADS=1 PYTHONPATH=$tree timeout 1200 .venv/bin/python -m slime_ext.orchestration.driver configs/dapo.yaml "${common[@]}" rollout.prompts_per_step=16 run.output_dir=$out/runs/dapo > $out/dapo.log 2>&1
echo "dapo rc=$? $(date +%T)" >> $out/done.txt
for cfg in dagrpo dagrpo_local_only collab_grpo; do
  OMP_NUM_THREADS=1 PYTHONPATH=$tree timeout 1200 .venv/bin/python -m slime_ext.orchestration.driver configs/$cfg.yaml "${common[@]}" rollout.prompts_per_step=8 \
    'dagrpo.phases=[{name: easy, levels: [L0], steps: 3, tau: 0.2, step_limit: 3}]' run.output_dir=$out/runs/$cfg > $out/$cfg.log 2>&1
  echo "$cfg rc=$? $(date +%T)" >> $out/done.txt
done
