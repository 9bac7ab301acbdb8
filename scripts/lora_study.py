"""LoRA RL against full training on the default job: held-out accuracy, trainer memory, step time, bytes per sync.

    python scripts/lora_study.py [--seeds 1 2 3] [--ranks 8 32] [--runs runs/lora_study] [--out results/lora] [k=v ...]

Arms: `configs/grpo.yaml` (full training) and `configs/grpo_lora.yaml` at each `--ranks` value
(`train.lora.rank=<r>`, `train.lora.alpha=2r`: the update's scale alpha / r stays 2; `--lora-sync`, default
adapter: the engine gets the adapters alone), every arm for the job's
`train.steps` from one SFT warm start (`sft.seed=0`; the full arm's first seed evaluates it). Finished runs are
skipped, so an interrupted study resumes. Writes to `--out`: `table.md` / `table.json` (held-out mean@4 and greedy,
the peak RSS of the run's processes, seconds per RL step, bytes sent per weight sync, mean ± std over seeds), the
per-prompt paired differences to full training, `curves.png` (training reward) and `runs/` (each run's small files
and gzipped per-prompt records). Step times compare runs made one after another on one machine: read them with
the machine's load in mind (the table names the machine and the date).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import keep_run_files, read_metrics  # noqa: E402
from slime_ext.tools.study import command_line, difference_table, run_one, save_figure, summarise, write_table  # noqa: E402

KEYS = ["mean@4", "greedy", "peak_rss_gib", "seconds_per_step", "sync_mb", "reward_last5"]


def arms(ranks: list[int], sync: str = "adapter") -> dict[str, tuple[str, list[str]]]:
    out = {"full": ("grpo.yaml", [])}
    for r in ranks:
        out[f"LoRA r{r}"] = ("grpo_lora.yaml", [f"train.lora.rank={r}", f"train.lora.alpha={2 * r}",
                                                f"train.lora.sync={sync}"])
    return out


def row_of(run: Path) -> dict[str, float]:
    final = json.loads((run / "eval_final.json").read_text())
    metrics = read_metrics(run)
    return {"mean@4": final["mean@4"], "greedy": final["greedy"],
            "peak_rss_gib": max(m.get("memory/peak_rss_gib", 0.0) for m in metrics),
            "seconds_per_step": fmean(m["time/step"] for m in metrics),
            "sync_mb": fmean(m.get("sync/bytes_sent", 0.0) for m in metrics) / 2**20,
            "reward_last5": fmean(m["reward/mean"] for m in metrics[-5:])}


def plot(out: Path, runs: dict[str, list[Path]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (arm, paths), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        for i, run in enumerate(paths):
            rows = read_metrics(run)
            ax.plot([r["step"] for r in rows], [r["reward/mean"] for r in rows], color=color, alpha=0.7,
                    label=arm if i == 0 else None)
    ax.set(title="Training reward (each line one seed)", xlabel="RL step", ylabel="reward/mean")
    ax.legend()
    save_figure(fig, out / "curves.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--lora-sync", choices=["adapter", "merged"], default="adapter",
                    help="how the LoRA arms refit the engine (train.lora.sync)")
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "lora_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "lora")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = command_line("lora_study.py", argv)
    grid = arms(args.ranks, args.lora_sync)
    runs: dict[str, list[Path]] = {a: [] for a in grid}
    for seed in args.seeds:
        for arm, (config, extra) in grid.items():
            warm_eval = [] if (arm == "full" and seed == args.seeds[0]) else ["eval.warm_start=false"]
            slug = arm.replace(" ", "_")
            runs[arm].append(run_one(config, seed, args.runs / f"{slug}-seed{seed}", [*args.overrides, *extra, *warm_eval]))
    args.out.mkdir(parents=True, exist_ok=True)
    for arm, paths in runs.items():
        for seed, run in zip(args.seeds, paths):
            keep_run_files(run, args.out / "runs" / f"{arm.replace(' ', '_')}-seed{seed}")
    rows = {arm: [row_of(p) for p in paths] for arm, paths in runs.items()}
    print(write_table(args.out, "LoRA RL against full training, the default job", summarise(rows),
                      {a: [str(p) for p in ps] for a, ps in runs.items()}, args.seeds, command, keys=KEYS))
    evals = {arm: {s: p / "eval_final.json" for s, p in zip(args.seeds, ps)} for arm, ps in runs.items()}
    print(difference_table(args.out, evals, "full", k=4))
    (args.out / "command.txt").write_text(command + "\n")
    plot(args.out, runs)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
