"""A recipe pilot's evaluations (warm start, every `eval_step*`, final) against its own warm start and against
the same seed's sharpening baselines (the warm start sampled at T = 0.7 and 0.4, no training), paired over the
held-out prompts: the question each pilot answers is whether RL beats a cooler sampler.

    python results/noise_floor_v2/compare_pilot.py results/noise_floor_v2/pilot_80steps --seed 0
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from slime_ext.studies.records import per_level_table, per_prompt_scores, read_records
from slime_ext.studies.stats import ci_text, paired_over_prompts

HERE = Path(__file__).resolve().parent


def _greedy(records: list[dict]) -> dict[str, float]:
    return {r["prompt_id"]: float(r["greedy_score"]) for r in records if r.get("greedy_score") is not None}


def _evaluations(run: Path) -> list[tuple[str, list[dict]]]:
    """(label, records) of the run's evaluations in step order."""
    steps = sorted(run.glob("eval_step*.records.jsonl.gz"), key=lambda p: int(re.search(r"step(\d+)", p.name)[1]))
    found = [("warm start", run / "eval_warm_start.records.jsonl.gz")]
    found += [(p.name.split(".")[0].removeprefix("eval_"), p) for p in steps]
    found.append(("final", run / "eval_final.records.jsonl.gz"))
    return [(label, read_records(p)) for label, p in found if p.exists()]


def compare(run: Path, seed: int) -> dict:
    evals = _evaluations(run)
    if not evals or evals[0][0] != "warm start":
        raise SystemExit(f"{run}: no eval_warm_start.records.jsonl.gz")
    warm = per_prompt_scores(evals[0][1])
    sharpen = {t: per_prompt_scores(read_records(HERE / "runs" / f"sharpen_s{seed}_T{t}" / "eval_sft.records.jsonl.gz"))
               for t in ("0.7", "0.4")}
    rows = []
    for label, records in evals:
        scores = per_prompt_scores(records)
        row = {"evaluation": label, "n_prompts": len(scores), "mean@4": float(np.mean(list(scores.values()))),
               "greedy": float(np.mean(list(_greedy(records).values()))),
               "per_level_mean@1": {r["level"]: r["mean@1"] for r in per_level_table(records)}}
        if label != "warm start":
            row["vs_warm_start"] = paired_over_prompts(scores, warm)
            row["greedy_vs_warm_start"] = paired_over_prompts(_greedy(records), _greedy(evals[0][1]))
        for t, base in sharpen.items():
            row[f"vs_sharpen_T{t}"] = paired_over_prompts(scores, base)
        rows.append(row)
    return {"run": str(run), "seed": seed, "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| evaluation | mean@4 | vs warm start (T = 1) | vs warm start at T = 0.7 | vs warm start at T = 0.4 "
             "| greedy | greedy vs warm start |", "| --- | ---: | --- | --- | --- | ---: | --- |"]
    for r in result["rows"]:
        vs = r.get("vs_warm_start")
        gvs = r.get("greedy_vs_warm_start")
        lines.append(f"| {r['evaluation']} | {100 * r['mean@4']:.1f} | {ci_text(vs) if vs else ''} "
                     f"| {ci_text(r['vs_sharpen_T0.7'])} | {ci_text(r['vs_sharpen_T0.4'])} "
                     f"| {100 * r['greedy']:.1f} | {ci_text(gvs) if gvs else ''} |")
    levels = list(result["rows"][0]["per_level_mean@1"])
    lines += ["", "Per level, mean@1 (%):", "", "| evaluation | " + " | ".join(levels) + " |",
              "| --- |" + " ---: |" * len(levels)]
    for r in result["rows"]:
        lines.append(f"| {r['evaluation']} | " + " | ".join(f"{100 * r['per_level_mean@1'][lv]:.1f}" for lv in levels)
                     + " |")
    lines += ["", "Points; paired over the same held-out prompts: mean difference ± SE over prompts [normal 95% "
              "interval] (`slime_ext.studies.stats.paired_over_prompts`). The sharpening columns compare each "
              "evaluation (T = 1) with the untrained warm start sampled cooler."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a pilot's directory (as kept by keep_run_files)")
    parser.add_argument("--seed", type=int, default=0, help="whose sharpening baselines (runs/sharpen_s<seed>_T*)")
    args = parser.parse_args()
    result = compare(args.run, args.seed)
    (args.run / "vs_sharpening.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.run / "vs_sharpening.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
