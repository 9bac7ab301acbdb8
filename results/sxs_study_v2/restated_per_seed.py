"""Interleaved (SxS) minus restated, accuracy paired over the 1026 held-out prompts within each seed alone (table.md
pools the seeds and gives each seed's point value only). Run from the repository root:
    OMP_NUM_THREADS=1 python results/sxs_study_v2/restated_per_seed.py > results/sxs_study_v2/restated_per_seed.md
"""
import gzip
import json

from slime_ext.algo.eval_stats import describe_difference, paired_difference

RUNS = "results/sxs_study_v2/runs/"


def mean_scores(path: str) -> dict[str, float]:
    return {r["prompt_id"]: sum(r["scores"]) / len(r["scores"]) for r in map(json.loads, gzip.open(path, "rt"))}


print("| seed | pair | prompts | SxS minus restated, mean@4 (95% CI, paired bootstrap) |\n| --- | --- | --- | --- |")
for seed in (0, 1, 2):
    for restated, sxs, name, label in (("restated_sft", "sxs_sft", "eval_sft", "SxS SFT - Restated SFT"),
                                       ("restated_rl", "sxs_rl", "eval_final", "SxS SFT->RL - Restated SFT->RL")):
        a = mean_scores(f"{RUNS}{restated}-seed{seed}/{name}.records.jsonl.gz")
        b = mean_scores(f"{RUNS}{sxs}-seed{seed}/{name}.records.jsonl.gz")
        ids = [p for p in a if p in b]
        print(f"| {seed} | {label} | {len(ids)} | {describe_difference(paired_difference([a[p] for p in ids], [b[p] for p in ids]))} |")
