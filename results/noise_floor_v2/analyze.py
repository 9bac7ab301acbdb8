"""The noise floor on task family v2 (issue 30, item 2): tables and plots from the runs of `run_study.sh`.

Reads `RUNS/grpo_s<seed>-<stamp>/` (GRPO from the warm start of SFT seed <seed>: evaluations before and after RL)
and `RUNS/sharpen_s<seed>_T<t>-<stamp>/` (the same warm start sampled at temperature t, no RL), copies each run's
small files and gzipped per-prompt records under `--out/runs/`, and writes `table.md` / `table.json`, per-level
tables and PNG plots.

    python results/noise_floor_v2/analyze.py RUNS [--out results/noise_floor_v2]

What the floor is: (1) the spread between seeds of the same recipe (SFT seed and RL seed change together), as
the standard deviation of each seed's accuracy and of its RL gain, and the smallest difference two arms of 3
seeds each could resolve with it (`min_detectable_difference`); (2) the sharpening gain, the accuracy a cooler
sampler adds to the warm start without any training, which an RL gain must exceed to show more than sharpening.
Accuracy is the mean score over a prompt's samples, averaged over prompts; within a seed, differences are paired
over the same held-out prompts; across seeds, t intervals over the per-seed values.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: slime_ext
from slime_ext.studies import (ci_text, keep_run_files, min_detectable_difference,  # noqa: E402
                               paired_over_prompts, per_level_table, per_prompt_scores, read_metrics, read_records,
                               t_interval)

CURVES = [("reward/mean", "reward (training rollouts)"), ("reward/all_wrong_groups", "all-wrong groups (no signal)"),
          ("reward/all_correct_groups", "all-correct groups (no signal)"), ("response_len/mean", "response tokens"),
          ("train/entropy", "policy entropy"), ("train/approx_kl_old", "approx KL to the sampler")]


def find_runs(runs: Path) -> tuple[dict[int, Path], dict[tuple[int, str], Path]]:
    """The latest complete run per seed (RL) and per seed and temperature (sharpening)."""
    grpo, sharpen = {}, {}
    for d in sorted(runs.iterdir()):
        m = re.fullmatch(r"grpo_s(\d+)-\d{8}-\d{6}(-\d+)?", d.name)
        if m and (d / "eval_final.json").is_file():
            grpo[int(m.group(1))] = d
        m = re.fullmatch(r"sharpen_s(\d+)_T([0-9.]+)-\d{8}-\d{6}(-\d+)?", d.name)
        if m and (d / "eval_sft.json").is_file():
            sharpen[(int(m.group(1)), m.group(2))] = d
    return grpo, sharpen


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def summarise(grpo: dict[int, Path], sharpen: dict[tuple[int, str], Path]) -> dict:
    per_seed, levels = [], {}
    for seed, run in sorted(grpo.items()):
        warm_recs, final_recs = (read_records(run / f"eval_{n}.records.jsonl") for n in ("warm_start", "final"))
        warm, final = (json.loads((run / f"eval_{n}.json").read_text()) for n in ("warm_start", "final"))
        row = {"seed": seed, "steps": len(read_metrics(run)), "n_prompts": final["n_prompts"],
               "n_samples": final["n_samples"], "warm": warm["mean_score"], "warm_se": warm["mean_score_stderr"],
               "final": final["mean_score"], "final_se": final["mean_score_stderr"], "warm_greedy": warm["greedy"],
               "final_greedy": final["greedy"], "warm_len": warm["mean_response_len"],
               "final_len": final["mean_response_len"],
               "rl_gain": paired_over_prompts(per_prompt_scores(final_recs), per_prompt_scores(warm_recs)),
               "sharpening": {}}
        for (s, t), srun in sorted(sharpen.items()):
            if s != seed:
                continue
            rep = json.loads((srun / "eval_sft.json").read_text())
            recs = read_records(srun / "eval_sft.records.jsonl")
            row["sharpening"][t] = {"accuracy": rep["mean_score"], "se": rep["mean_score_stderr"],
                                    "gain": paired_over_prompts(per_prompt_scores(recs), per_prompt_scores(warm_recs)),
                                    "per_level": per_level_table(recs)}
        levels[seed] = {"warm": per_level_table(warm_recs), "final": per_level_table(final_recs)}
        per_seed.append(row)
    across: dict = {}
    if per_seed:
        for key in ("warm", "final", "warm_greedy", "final_greedy"):
            vals = [r[key] for r in per_seed]
            across[key] = dict(t_interval(vals), sd=float(np.std(vals, ddof=1)) if len(vals) > 1 else None)
        across["rl_gain"] = t_interval([r["rl_gain"]["diff"] for r in per_seed])
        temps = sorted({t for r in per_seed for t in r["sharpening"]}, key=float, reverse=True)
        for t in temps:
            gains = [r["sharpening"][t]["gain"]["diff"] for r in per_seed if t in r["sharpening"]]
            across[f"sharpening_gain_T{t}"] = t_interval(gains)
        gains = [r["rl_gain"]["diff"] for r in per_seed]
        across["rl_gain"]["sd"] = float(np.std(gains, ddof=1)) if len(gains) > 1 else None
        sd = across["final"]["sd"]
        across["min_detectable_difference_3_vs_3"] = min_detectable_difference(sd, 3) if sd is not None else None
        # arms that start from the same warm starts compare their gains, which spread less than the accuracies
        gsd = across["rl_gain"]["sd"]
        across["min_detectable_gain_difference_3_vs_3"] = min_detectable_difference(gsd, 3) if gsd is not None else None
    return {"per_seed": per_seed, "per_level": levels, "across_seeds": across}


def markdown(summary: dict) -> str:
    rows, a = summary["per_seed"], summary["across_seeds"]
    temps = sorted({t for r in rows for t in r["sharpening"]}, key=float, reverse=True)
    head = ("| SFT = RL seed | steps | warm start (T=1) | after GRPO | RL gain, paired | greedy: warm -> GRPO | "
            + " | ".join(f"warm start at T={t} (gain, paired)" for t in temps) + " | response tokens: warm -> GRPO |")
    out = ["# Noise floor on task family v2: GRPO from three warm starts, and the sharpening baseline", "",
           f"Held-out set: {rows[0]['n_prompts']} prompts (levels V2-V10, equal shares) x {rows[0]['n_samples']} "
           "samples at temperature 1, plus one greedy answer per prompt. Accuracy in percent: the mean score over "
           "samples per prompt, averaged over prompts, ± its standard error over prompts. Gains are paired over the "
           "same prompts (points, ± SE).", "", head,
           "| " + " | ".join(["---:"] * (head.count("|") - 1)) + " |"]
    for r in rows:
        g = r["rl_gain"]
        cells = [str(r["seed"]), str(r["steps"]), f"{pct(r['warm'])} ± {pct(r['warm_se'])}",
                 f"{pct(r['final'])} ± {pct(r['final_se'])}", f"{100 * g['diff']:+.1f} ± {100 * g['se']:.1f}",
                 f"{pct(r['warm_greedy'])} -> {pct(r['final_greedy'])}"]
        for t in temps:
            sh = r["sharpening"].get(t)
            cells.append("-" if sh is None else f"{pct(sh['accuracy'])} ({100 * sh['gain']['diff']:+.1f} ± "
                                                f"{100 * sh['gain']['se']:.1f})")
        cells.append(f"{r['warm_len']:.0f} -> {r['final_len']:.0f}")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "## Across seeds (mean, SE and 95% t interval over seeds; SD = spread between seeds)", ""]
    for key, label in (("warm", "warm start accuracy"), ("final", "accuracy after GRPO"),
                       ("warm_greedy", "warm start greedy"), ("final_greedy", "greedy after GRPO")):
        d = a[key]
        sd = "-" if d["sd"] is None else f"{100 * d['sd']:.1f}"
        out.append(f"- {label}: {100 * d['mean']:.1f}, SD between seeds {sd} points (n = {d['n']})")
    out.append(f"- RL gain (after GRPO - warm start, points): {ci_text(a['rl_gain'])}")
    for t in temps:
        out.append(f"- sharpening gain (warm start at T={t} - at T=1, no training, points): "
                   f"{ci_text(a[f'sharpening_gain_T{t}'])}")
    mdd = a.get("min_detectable_difference_3_vs_3")
    if mdd is not None:
        out.append(f"- **noise floor**: two arms of 3 seeds each whose accuracies spread like these seeds' "
                   f"(SD {100 * a['final']['sd']:.1f}) resolve a difference of at least {100 * mdd:.1f} points "
                   "(95% t half-width on 4 degrees of freedom); a smaller difference is no measured difference.")
    gmdd = a.get("min_detectable_gain_difference_3_vs_3")
    if gmdd is not None:
        out.append(f"- **noise floor for arms from the same warm starts** (each arm's gain over its own warm start, "
                   f"3 seeds each): the RL gains spread with SD {100 * a['rl_gain']['sd']:.1f} points between seeds, so "
                   f"two arms' gains must differ by at least {100 * gmdd:.1f} points to be a measured difference.")
    out += ["", "## Per level (mean@1 %, warm start -> after GRPO, per seed)", "",
            "| level | " + " | ".join(f"seed {r['seed']}" for r in rows) + " |",
            "| --- | " + " | ".join(["---:"] * len(rows)) + " |"]
    lv = summary["per_level"]
    for i, level in enumerate(x["level"] for x in lv[rows[0]["seed"]]["warm"]):
        cells = []
        for r in rows:
            w, f = lv[r["seed"]]["warm"][i], lv[r["seed"]]["final"][i]
            cells.append(f"{pct(w['mean@1'])} -> {pct(f['mean@1'])}")
        out.append(f"| {level} | " + " | ".join(cells) + " |")
    out += ["", "Plots: `curves.png` (training rollouts over RL steps, every seed), `per_level.png` (accuracy per "
            "level before and after GRPO, and at the cooler temperatures)."]
    return "\n".join(out) + "\n"


def plot(grpo: dict[int, Path], summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (key, title) in zip(axes.flat, CURVES):
        for seed, run in sorted(grpo.items()):
            ys = [(r.get("step", i), r[key]) for i, r in enumerate(read_metrics(run)) if key in r]
            if ys:
                ax.plot(*zip(*ys), label=f"seed {seed}")
        ax.set_title(title)
        ax.set_xlabel("RL step")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in summary["per_seed"]:
        lv = summary["per_level"][r["seed"]]
        names = [x["level"] for x in lv["warm"]]
        xs = np.arange(len(names))
        ax.plot(xs, [100 * x["mean@1"] for x in lv["warm"]], "o--", color=f"C{r['seed']}", label=f"s{r['seed']} warm T=1")
        ax.plot(xs, [100 * x["mean@1"] for x in lv["final"]], "o-", color=f"C{r['seed']}", label=f"s{r['seed']} GRPO")
        for j, (t, sh) in enumerate(sorted(r["sharpening"].items())):
            ax.plot(xs, [100 * x["mean@1"] for x in sh["per_level"]], ":", marker="x", color=f"C{r['seed']}",
                    alpha=0.5 + 0.25 * j, label=f"s{r['seed']} warm T={t}")
        ax.set_xticks(xs, names)
    ax.set_ylabel("mean@1, %")
    ax.set_title("Held-out accuracy per level")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "per_level.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args()
    grpo, sharpen = find_runs(args.runs)
    if not grpo:
        raise SystemExit(f"{args.runs}: no finished grpo_s<seed>-<stamp>/ run (eval_final.json) yet")
    for seed, run in grpo.items():
        keep_run_files(run, args.out / "runs" / f"grpo_s{seed}")
    for (seed, t), run in sharpen.items():
        keep_run_files(run, args.out / "runs" / f"sharpen_s{seed}_T{t}")
    summary = summarise(grpo, sharpen)
    (args.out / "table.json").write_text(json.dumps(summary, indent=1))
    md = markdown(summary)
    (args.out / "table.md").write_text(md)
    plot(grpo, summary, args.out)
    print(md)


if __name__ == "__main__":
    main()
