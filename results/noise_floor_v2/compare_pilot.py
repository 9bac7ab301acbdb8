"""A recipe pilot's evaluations (warm start, every `eval_step*`, final) against its own warm start and against
the same seed's sharpening baselines (the warm start sampled at T = 0.7 and 0.4, no training), paired over the
held-out prompts: the question each pilot answers is whether RL beats a cooler sampler. With `--cooled T=RECORDS`
(the final weights sampled at temperature T), a row pairs the trained model at T with the warm start at the same T:
whether RL adds anything on top of sharpening.

    python results/noise_floor_v2/compare_pilot.py results/noise_floor_v2/pilot_80steps --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
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


def _summary(label: str, records: list[dict], with_greedy: bool) -> tuple[dict[str, float], dict]:
    """An evaluation's per-prompt scores and its row's summary columns (no greedy column for a sampled-only one)."""
    scores = per_prompt_scores(records)
    greedy = float(np.mean(list(_greedy(records).values()))) if with_greedy else None
    return scores, {"evaluation": label, "n_prompts": len(scores), "mean@4": float(np.mean(list(scores.values()))),
                    "greedy": greedy, "per_level_mean@1": {r["level"]: r["mean@1"] for r in per_level_table(records)}}


def compare(run: Path, seed: int, sharpen_records: dict[str, Path] | None = None,
            cooled_records: dict[str, Path] | None = None) -> dict:
    """`sharpen_records` ({temperature: records file}) replaces the seed's committed sharpening runs: a pilot
    whose warm start is not the committed one is paired with its own warm start sampled cooler.
    `cooled_records` ({temperature: records file}): the final weights sampled at that temperature, each paired with
    the warm start at the same temperature (which `sharpen_records` must hold)."""
    evals = _evaluations(run)
    if not evals or evals[0][0] != "warm start":
        raise SystemExit(f"{run}: no eval_warm_start.records.jsonl.gz")
    warm, warm_greedy = per_prompt_scores(evals[0][1]), _greedy(evals[0][1])
    sharpen_records = sharpen_records or {
        t: HERE / "runs" / f"sharpen_s{seed}_T{t}" / "eval_sft.records.jsonl.gz" for t in ("0.7", "0.4")}
    sharpen = {t: per_prompt_scores(read_records(p)) for t, p in sharpen_records.items()}
    rows = []
    for label, records in evals:
        scores, row = _summary(label, records, with_greedy=True)
        if label != "warm start":
            row["vs_warm_start"] = paired_over_prompts(scores, warm)
            row["greedy_vs_warm_start"] = paired_over_prompts(_greedy(records), warm_greedy)
        for t, base in sharpen.items():
            row[f"vs_sharpen_T{t}"] = paired_over_prompts(scores, base)
        rows.append(row)
    for t, path in (cooled_records or {}).items():
        if t not in sharpen:
            raise SystemExit(f"--cooled {t}: no warm start records at T = {t} to pair with (give --sharpen {t}=...)")
        scores, row = _summary(f"final at T = {t}", read_records(path), with_greedy=False)
        rows.append({**row, "vs_warm_start": paired_over_prompts(scores, warm),
                     f"vs_sharpen_T{t}": paired_over_prompts(scores, sharpen[t]),
                     "source": os.path.relpath(path, HERE.parents[1])})
    used = {t: os.path.relpath(p, HERE.parents[1]) for t, p in sharpen_records.items()}
    return {"run": str(run), "seed": seed, "sharpening": used, "rows": rows}


def markdown(result: dict) -> str:
    temps = list(result["sharpening"])
    lines = ["| evaluation | mean@4 | vs warm start (T = 1) | " + " | ".join(f"vs warm start at T = {t}" for t in temps)
             + " | greedy | greedy vs warm start |", "| --- | ---: | --- |" + " --- |" * len(temps) + " ---: | --- |"]
    for r in result["rows"]:
        vs = r.get("vs_warm_start")
        gvs = r.get("greedy_vs_warm_start")
        greedy = "" if r["greedy"] is None else f"{100 * r['greedy']:.1f}"
        lines.append(f"| {r['evaluation']} | {100 * r['mean@4']:.1f} | {ci_text(vs) if vs else ''} | "
                     + " | ".join(ci_text(r[f"vs_sharpen_T{t}"]) if f"vs_sharpen_T{t}" in r else "" for t in temps)
                     + f" | {greedy} | {ci_text(gvs) if gvs else ''} |")
    levels = list(result["rows"][0]["per_level_mean@1"])
    lines += ["", "Per level, mean@1 (%):", "", "| evaluation | " + " | ".join(levels) + " |",
              "| --- |" + " ---: |" * len(levels)]
    for r in result["rows"]:
        lines.append(f"| {r['evaluation']} | " + " | ".join(f"{100 * r['per_level_mean@1'][lv]:.1f}" for lv in levels)
                     + " |")
    lines += ["", "Points; paired over the same held-out prompts: mean difference ± SE over prompts [normal 95% "
              "interval] (`slime_ext.studies.stats.paired_over_prompts`). The sharpening columns compare each "
              "evaluation (T = 1) with the untrained warm start sampled cooler."]
    if any(r["evaluation"].startswith("final at T") for r in result["rows"]):
        lines[-1] += (" A `final at T = t` row is the final weights sampled at t: its column at t pairs it with the "
                      "warm start sampled at the same t (does RL add anything on top of sharpening).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a pilot's directory (as kept by keep_run_files)")
    parser.add_argument("--seed", type=int, default=0, help="whose sharpening baselines (runs/sharpen_s<seed>_T*)")
    parser.add_argument("--sharpen", action="append", default=[], metavar="T=RECORDS",
                        help="the warm start's records at temperature T (instead of the seed's committed ones)")
    parser.add_argument("--cooled", action="append", default=[], metavar="T=RECORDS",
                        help="the final weights' records at temperature T, paired with the warm start at T")
    args = parser.parse_args()
    given = dict(item.split("=", 1) for item in args.sharpen)
    cooled = dict(item.split("=", 1) for item in args.cooled)
    result = compare(args.run, args.seed, {t: Path(p) for t, p in given.items()} or None,
                     {t: Path(p) for t, p in cooled.items()} or None)
    (args.run / "vs_sharpening.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.run / "vs_sharpening.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
