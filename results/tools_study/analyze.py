"""The tools study's table and plots (issue 31): GRPO with the calculator against the same model without tools.

Reads the runs that `run_study.sh` wrote (`RUNS/<arm>_s<seed>-<stamp>/`), copies the small files of each run next
to this script (config, summary, metrics, evaluation reports, per-prompt records gzipped, final table), and writes
`table.md` and `table.json` (per seed and across seeds) and PNG plots of the mechanism over RL steps.

    python results/tools_study/analyze.py RUNS [--out results/tools_study]

Intervals: per seed, the tools - no-tools difference is paired over the same held-out prompts (each prompt's
mean over its 4 samples; standard error of the per-prompt differences). Across seeds, the mean of the per-seed
differences with a t interval on n_seeds - 1 degrees of freedom: the spread between RL seeds, not one run's
standard error, is the uncertainty of a claim about the recipe.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: slime_ext
from slime_ext.studies import (ci_text, keep_run_files, paired_over_prompts, per_prompt_scores,  # noqa: E402
                               read_metrics, read_records, t_interval)

ARMS = ("tools", "notools")
KEPT = ("config.yaml", "summary.json", "metrics.jsonl", "eval_warm_start.json", "eval_final.json", "final_table.md")
MECHANISM = [("reward/mean", "reward (training rollouts)"), ("env/tool_call_share", "episodes that call a tool"),
             ("env/tool_calls_mean", "tool calls per episode"), ("env/tool_error_rate", "tool error rate"),
             ("env/turns_mean", "turns per episode"), ("env/generated_tokens_mean", "generated tokens per episode")]


def find_runs(runs: Path) -> dict[tuple[str, int], Path]:
    found = {}
    for d in sorted(runs.iterdir()):
        m = re.fullmatch(r"(tools|notools)_s(\d+)-\d{8}-\d{6}(-\d+)?", d.name)
        if m and (d / "eval_final.json").is_file():
            found[(m.group(1), int(m.group(2)))] = d  # the latest complete run of an arm and seed
    return found


def last_mean(rows: list[dict], key: str, n: int = 5) -> float | None:
    vals = [r[key] for r in rows[-n:] if key in r]
    return float(np.mean(vals)) if vals else None


def pct(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args()
    runs = find_runs(args.runs)
    seeds = sorted({s for (_, s) in runs})
    per_seed, rows_md = [], []
    evals: dict[tuple[str, int], dict] = {}
    for (arm, seed), run in sorted(runs.items()):
        keep_run_files(run, args.out / "runs" / f"{arm}_s{seed}", KEPT)
        final, warm = (json.loads((run / f"eval_{n}.json").read_text()) for n in ("final", "warm_start"))
        rm = final["meta"]["response_metrics"]
        m = read_metrics(run)
        evals[(arm, seed)] = {"final": per_prompt_scores(read_records(run / "eval_final.records.jsonl")),
                              "warm": per_prompt_scores(read_records(run / "eval_warm_start.records.jsonl"))}
        row = {"arm": arm, "seed": seed, "warm_accuracy": warm["mean_score"], "final_accuracy": final["mean_score"],
               "final_accuracy_stderr": final["mean_score_stderr"], "final_greedy": final["greedy"],
               "warm_greedy": warm["greedy"], "eval_tool_calls": rm.get("tool_calls"), "eval_turns": rm.get("turns"),
               "eval_tool_errors": rm.get("tool_errors"), "mean_response_len": final["mean_response_len"],
               "train_tool_call_share_last5": last_mean(m, "env/tool_call_share"),
               "train_tool_error_rate_last5": last_mean(m, "env/tool_error_rate"),
               "train_reward_first": m[0]["reward/mean"], "train_reward_last5": last_mean(m, "reward/mean"),
               "steps": len(m), "n_prompts": final["n_prompts"], "n_samples": final["n_samples"],
               "rl_gain": paired_over_prompts(evals[(arm, seed)]["final"], evals[(arm, seed)]["warm"])}
        per_seed.append(row)
    summary: dict = {"seeds": seeds, "per_seed": per_seed, "paired_by_seed": {}, "across_seeds": {}}
    diffs = []
    for seed in seeds:
        if ("tools", seed) in evals and ("notools", seed) in evals:
            d = paired_over_prompts(evals[("tools", seed)]["final"], evals[("notools", seed)]["final"])
            summary["paired_by_seed"][seed] = d
            diffs.append(d["diff"])
    summary["across_seeds"]["tools_minus_notools_accuracy"] = t_interval(diffs) if diffs else None
    for arm in ARMS:
        gains = [r["rl_gain"]["diff"] for r in per_seed if r["arm"] == arm]
        summary["across_seeds"][f"rl_gain_{arm}"] = t_interval(gains) if gains else None
    (args.out / "table.json").write_text(json.dumps(summary, indent=1))

    rows_md.append("| arm | seed | steps | warm start accuracy | final accuracy ± SE | RL gain (paired, points) | greedy | "
                   "tool calls / episode (eval) | turns (eval) | tool error rate, % (train, last 5 steps) | train reward, % (first step -> last 5 steps) |")
    rows_md.append("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for r in per_seed:
        g = r["rl_gain"]
        rows_md.append(
            f"| {r['arm']} | {r['seed']} | {r['steps']} | {pct(r['warm_accuracy'])} | {pct(r['final_accuracy'])} ± "
            f"{pct(r['final_accuracy_stderr'])} | {100 * g['diff']:+.1f} ± {100 * g['se']:.1f} | {pct(r['final_greedy'])} | "
            f"{r['eval_tool_calls'] if r['eval_tool_calls'] is not None else '-':.3} | "
            f"{r['eval_turns'] if r['eval_turns'] is not None else '-':.3} | {pct(r['train_tool_error_rate_last5'], 2)} | "
            f"{pct(r['train_reward_first'])} -> {pct(r['train_reward_last5'])} |")
    lines = ["# Tools study: GRPO with the calculator against the same model without tools", "",
             f"Seeds {seeds} (RL seeds; one warm start per arm, sft.seed=0); held-out set: "
             f"{per_seed[0]['n_prompts']} prompts x {per_seed[0]['n_samples']} samples at temperature 1 (levels T1-T2). "
             "Accuracy: the mean score over all samples (each prompt's mean over its samples, averaged), in percent; "
             "± is the standard error over prompts; greedy: one greedy answer per prompt. The warm start is the same "
             "checkpoint for every seed of an arm; its evaluation differs by seed only in the sampling seed.", "", *rows_md, "", "## Paired differences", ""]
    for seed, d in summary["paired_by_seed"].items():
        lines.append(f"- seed {seed}: tools - no tools, final accuracy: {100 * d['diff']:+.1f} ± {100 * d['se']:.1f} points "
                     f"(paired over {d['n_prompts']} prompts, 95% [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}])")
    a = summary["across_seeds"]
    if a["tools_minus_notools_accuracy"]:
        lines.append(f"- across seeds: tools - no tools {ci_text(a['tools_minus_notools_accuracy'])} points "
                     "(mean ± SE over seeds, 95% t interval)")
    for arm in ARMS:
        if a.get(f"rl_gain_{arm}"):
            lines.append(f"- RL gain ({arm}: final - warm start, paired per seed, then over seeds): "
                         f"{ci_text(a[f'rl_gain_{arm}'])} points")
    lines += ["", "Plots: `mechanism.png` (training rollouts over RL steps, every seed)."]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    plot(runs, args.out / "mechanism.png")
    print("\n".join(lines))


def plot(runs: dict[tuple[str, int], Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (key, title) in zip(axes.flat, MECHANISM):
        for (arm, seed), run in sorted(runs.items()):
            m = read_metrics(run)
            ys = [(r.get("step", i), r[key]) for i, r in enumerate(m) if key in r]
            if ys:
                ax.plot(*zip(*ys), color="tab:blue" if arm == "tools" else "tab:orange",
                        alpha=0.5 + 0.15 * seed, label=f"{arm} s{seed}")
        ax.set_title(title)
        ax.set_xlabel("RL step")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
