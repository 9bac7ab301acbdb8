# Seed 2's two SFT arms streamed again side by side with nothing else running (2026-12-07, after the study was
# stopped): the study's first CoT SFT stream (02:13-02:15) overlapped about a minute of unit tests on this 2-core
# machine; those first timelines are kept in latency/seed2/superseded/.
set -e
cd /work/wt-sxs
O=/work/sxs_out/latency/seed2; mkdir -p $O/superseded
mv $O/CoT_SFT.timing.jsonl $O/SxS_SFT.timing.jsonl $O/superseded/
P=.venv/bin/python
$P -m slime_ext.tools.stream_timing .cache/slime_ext/warmstart/7fe7ec73e4d30adb/hf --config results/duet_study_v2/runs/GRPO_full-seed2/config.yaml --prompts 64 --out $O/CoT_SFT.timing.jsonl
$P -m slime_ext.tools.stream_timing .cache/slime_ext/warmstart/ec8568e868ccfc18/hf --config runs/sxs_study_v2/sxs_sft-seed2/sxs_sft-20261207-021509/config.yaml --prompts 64 --out $O/SxS_SFT.timing.jsonl --speak-only
