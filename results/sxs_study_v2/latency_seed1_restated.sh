# Seed 1's restated control was streamed by the study on 2026-12-07 (Restated SFT 06:12-06:13, Restated SFT->RL
# 06:50-06:51) on another machine than seed 1's other arms (streamed 2026-11-30, latency/seed1/): seconds from two
# machines do not pair, so SxS SFT was streamed again here from its archived warm start, and the three timelines
# of this session were put in their own session folder (the study now does that itself,
# slime_ext/tools/stream_sessions.py). Same tokens as its 2026-11-30 stream on all 64 prompts; mean total 1.211 s
# here against 0.528 s then (this machine 2.3x slower per token).
set -e
cd /work/wt-sxs
python -m slime_ext.tools.warm_start_archive unpack /work/main/results/sxs_study_v2/warm_starts/sxs_seed1_20261130-72c2b0379e7559cd.tar.gz .cache/slime_ext
S=/work/sxs_out/latency/seed1/20261207-vm-b07c71ae
mkdir -p $S && mv /work/sxs_out/latency/seed1/Restated_SFT*.jsonl $S/
.venv/bin/python -m slime_ext.tools.stream_timing .cache/slime_ext/warmstart/72c2b0379e7559cd/hf --config /work/sxs_out/runs/sxs_sft-seed1/config.yaml --prompts 64 --out $S/SxS_SFT.timing.jsonl --speak-only
# session.json (host, boot id, date) written beside them, as stream_sessions.folder_for_new_stream writes it
