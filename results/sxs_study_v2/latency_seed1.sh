set -e
cd /work/wt-sxs
O=/work/sxs_out/latency/seed1; mkdir -p $O
P=.venv/bin/python
$P -m slime_ext.tools.stream_timing .cache/slime_ext/warmstart/ae98aad40e883ee3/hf --config results/duet_study_v2/runs/GRPO_full-seed1/config.yaml --prompts 64 --out $O/CoT_SFT.timing.jsonl
$P -m slime_ext.tools.stream_timing .cache/slime_ext/warmstart/72c2b0379e7559cd/hf --config runs/sxs_study_v2/sxs_sft-seed1/sxs_sft-20261129-235358/config.yaml --prompts 64 --out $O/SxS_SFT.timing.jsonl --speak-only
$P -m slime_ext.tools.stream_timing runs/sxs_study_v2/sxs_rl-seed1/sxs_rl-20261130-005036/hf --config runs/sxs_study_v2/sxs_rl-seed1/sxs_rl-20261130-005036/config.yaml --prompts 64 --out $O/SxS_SFT_to_RL.timing.jsonl --speak-only
$P -m slime_ext.tools.stream_timing runs/sxs_study_v2/sxs_rl_shaping-seed1/sxs_rl-20261130-011619/hf --config runs/sxs_study_v2/sxs_rl_shaping-seed1/sxs_rl-20261130-011619/config.yaml --prompts 64 --out $O/SxS_SFT_to_RL_shaping.timing.jsonl --speak-only
