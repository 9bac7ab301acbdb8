# usage: ident_all.sh SIDE TREE   (runs every method config's first 3 RL steps after a 300-step L0 SFT)
side=$1; tree=$2
out=/tmp/ident29b_$side; rm -rf $out; mkdir -p $out
cd $tree
for cfg in grpo dapo tandem tandem_klreg tandem_grpo duet duet_tandem sxs_sft sxs_rl dagrpo dagrpo_local_only collab_grpo; do
  OMP_NUM_THREADS=1 PYTHONPATH=$tree timeout 1200 .venv/bin/python -m slime_ext.orchestration.driver configs/$cfg.yaml \
    'data.synthetic.train_levels=[L0]' 'data.synthetic.eval_levels=[L0]' data.synthetic.n_train=2000 data.synthetic.n_eval=64 \
    sft.steps=300 sft.batch_size=32 rollout.prompts_per_step=8 rollout.n_samples_per_prompt=8 train.steps=3 \
    'run.stages=[data,tokenizer,sft,rl]' run.output_dir=$out/runs/$cfg run.cache_dir=$out/cache > $out/$cfg.log 2>&1
  echo "$cfg rc=$? $(date +%T)" >> $out/done.txt
done
