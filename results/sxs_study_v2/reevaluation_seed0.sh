set -e
cd /work/main
W=/work/wt-sxs/runs/sxs_study_v2
.venv/bin/python -m slime_ext.tools.eval_checkpoint /work/wt-sxs/.cache/slime_ext/warmstart/e4650d54c8f38347/hf --config $W/sxs_sft-seed0/sxs_sft-20261129-202059/config.yaml --no-progress --out /work/sxs_reeval/sxs_sft/eval_sft.json
.venv/bin/python -m slime_ext.tools.eval_checkpoint $W/sxs_rl-seed0/sxs_rl-20261129-210846 --no-progress --out /work/sxs_reeval/sxs_rl/eval_final.json
.venv/bin/python -m slime_ext.tools.eval_checkpoint $W/sxs_rl_shaping-seed0/sxs_rl-20261129-213408 --no-progress --out /work/sxs_reeval/sxs_rl_shaping/eval_final.json
echo ALLDONE
