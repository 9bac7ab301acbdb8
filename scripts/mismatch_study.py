"""Mismatch study on the embedded default: a bf16 engine against the fp32 trainer, three corrections.

    python scripts/mismatch_study.py [--seeds 0 1 2] [--runs runs/mismatch_study] [--out results/mismatch_study] [k=v ...]

Arms (all `configs/grpo_quick.yaml` with `rollout.precision=bf16`, the trainer's old logprobs recomputed):
no correction, TIS (token-level truncation at 2), TIS + rollout routing replay. They share one SFT warm
start (`sft.seed=0`) and differ only in the correction and `run.seed`. Finished runs are skipped, so an
interrupted study resumes. Writes to `--out`: `table.md` / `table.json` (held-out mean@4 and greedy with
standard errors over seeds, the mismatch metrics averaged over steps), the paired difference to no
correction, and `mismatch_over_steps.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import mean, stdev

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import read_metrics  # noqa: E402
from slime_ext.tools.study import command_line, difference_table, run_one, save_figure  # noqa: E402

COMMON = ["rollout.precision=bf16", "grpo.old_logprobs=trainer"]
ARMS = {
    "no correction": [],
    "TIS": ["grpo.mismatch.mode=truncate", "grpo.mismatch.cap=2.0"],
    "TIS + routing replay": ["grpo.mismatch.mode=truncate", "grpo.mismatch.cap=2.0", "train.routing_replay=true"],
}
STEP_KEYS = ["train/mismatch/abs_diff_mean", "train/mismatch/abs_diff_max", "train/mismatch/kl",
             "train/mismatch/truncated_frac", "train/clip_frac"]


def routing_keys(metrics: list[dict]) -> list[str]:
    return sorted({k for m in metrics for k in m if "routing" in k})


def row_of(run: Path) -> dict[str, float]:
    final = json.loads((run / "eval_final.json").read_text())
    metrics = read_metrics(run)
    row = {"mean@4": final["mean@4"], "greedy": final["greedy"]}
    for key in STEP_KEYS + routing_keys(metrics):
        values = [m[key] for m in metrics if key in m]
        if values:
            row[key.removeprefix("train/")] = mean(values)
    return row


def cell(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.4g}" if values else "-"
    return f"{mean(values):.4g} ± {stdev(values) / math.sqrt(len(values)):.2g}"


def plot(out: Path, runs: dict[str, list[Path]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["train/mismatch/abs_diff_mean", "train/mismatch/kl", "train/mismatch/truncated_frac", "reward/mean"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6))
    for ax, key in zip(axes, keys):
        for arm, paths in runs.items():
            per_seed = [[m.get(key, float("nan")) for m in read_metrics(p)] for p in paths]
            steps = range(min(len(s) for s in per_seed))
            ax.plot(list(steps), [mean(s[i] for s in per_seed) for i in steps], label=arm)
        ax.set_title(key.removeprefix("train/"), fontsize=9)
        ax.set_xlabel("RL step")
    axes[0].legend(fontsize=8)
    save_figure(fig, out / "mismatch_over_steps.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "mismatch_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "mismatch_study")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                    help="run only these arms (the table covers the arms run so far)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = command_line("mismatch_study.py", argv)
    rows: dict[str, list[dict[str, float]]] = {a: [] for a in args.arms}
    runs: dict[str, list[Path]] = {a: [] for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            extra = ARMS[arm]
            slug = arm.replace(" ", "_").replace("+", "and")
            run = run_one("grpo_quick.yaml", seed, args.runs / f"{slug}-seed{seed}", [*COMMON, *args.overrides, *extra])
            rows[arm].append(row_of(run))
            runs[arm].append(run)
    keys = sorted({k for rs in rows.values() for r in rs for k in r}, key=lambda k: (k not in ("mean@4", "greedy"), k))
    lines = ["| arm | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    for arm, rs in rows.items():
        lines.append(f"| {arm} | " + " | ".join(cell([r[k] for r in rs if k in r]) for k in keys) + " |")
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = (f"command: `{command}`  \nseeds: {args.seeds} (mean ± standard error over seeds; step metrics are "
            f"each run's mean over its steps)  \ndate: {datetime.now(timezone.utc).isoformat(timespec='seconds')}, "
            f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs")
    (args.out / "table.md").write_text(f"# Mismatch study: bf16 engine, fp32 trainer\n\n{meta}\n\n{table}\n")
    (args.out / "table.json").write_text(json.dumps({"rows": rows, "runs": {a: [str(p) for p in ps] for a, ps in runs.items()},
                                                     "seeds": args.seeds, "command": command}, indent=2) + "\n")
    print(table)
    print(difference_table(args.out, {a: {seed: p / "eval_final.json" for seed, p in zip(args.seeds, ps)}  # all ran
                                            for a, ps in runs.items()}, "no correction"))
    plot(args.out, runs)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
