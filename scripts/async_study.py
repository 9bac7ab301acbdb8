"""Does asynchronous RL cost accuracy? The default GRPO job at rollout.max_staleness 0 and 2, paired by seed.

    python scripts/async_study.py [--seeds 1 2 3] [--runs runs/async_study] [--out results/async_study] [k=v ...]

Arms: `configs/grpo.yaml` as it is (K = 0, on-policy) and with `rollout.max_staleness=2` (every other key the
same: the embedded engine, `stale_groups: wait` without partial rollouts, so step t trains rollout t generated
by version max(0, t - 2); the trainer's recomputed logprobs are the proximal policy and `grpo.mismatch` stays
off, as in the default job). Both arms share one SFT warm start (`sft.seed=0`) and differ only in K and
`run.seed`; the warm start is evaluated once (the first K = 0 run). Finished runs are skipped, so an
interrupted study resumes. Writes to `--out`: `table.md` / `table.json` (held-out mean@4 and greedy per arm
over seeds, the staleness seen), the per-prompt paired difference K=2 - K=0, `curves.png` (training reward
and staleness over steps) and `command.txt`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import fmean, stdev

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import read_metrics  # noqa: E402
from slime_ext.tools.study import command_line, difference_table, run_one, save_figure  # noqa: E402

ARMS = {"K=0": [], "K=2": ["rollout.max_staleness=2"],
        # the decoupled loss's correction on: behaviour -> proximal weights masked outside [0.5, 2] per token (IcePop)
        "K=2 + IcePop": ["rollout.max_staleness=2", "grpo.mismatch.mode=mask"]}


def row_of(run: Path) -> dict[str, float]:
    final = json.loads((run / "eval_final.json").read_text())
    metrics = read_metrics(run)
    return {"mean@4": final["mean@4"], "greedy": final["greedy"], "n_prompts": final.get("n_prompts", 0),
            "staleness_max": max(m.get("rollout/staleness_max", 0.0) for m in metrics),
            "reward_last5": fmean(m["reward/mean"] for m in metrics[-5:]),
            "rl_seconds": sum(m["time/step"] for m in metrics)}


def cell(values: list[float], scale: float = 1.0) -> str:
    if len(values) < 2:
        return f"{scale * values[0]:.4g}" if values else "-"
    return f"{scale * fmean(values):.4g} ± {scale * stdev(values) / math.sqrt(len(values)):.2g}"


def plot(out: Path, runs: dict[str, list[Path]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for (arm, paths), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
        for i, run in enumerate(paths):
            rows = read_metrics(run)
            steps = [r["step"] for r in rows]
            ax1.plot(steps, [r["reward/mean"] for r in rows], color=color, alpha=0.7,
                     label=arm if i == 0 else None)
            ax2.plot(steps, [r.get("rollout/staleness_max", 0.0) for r in rows], color=color, alpha=0.7,
                     label=arm if i == 0 else None)
    ax1.set(title="Training reward (each line one seed)", xlabel="step", ylabel="reward/mean")
    ax2.set(title="Staleness of the trained tokens (max per step)", xlabel="step", ylabel="versions behind")
    ax1.legend()
    ax2.legend()
    save_figure(fig, out / "curves.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "async_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "async_study")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=["K=0", "K=2"])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = command_line("async_study.py", argv)
    arms = {a: ARMS[a] for a in args.arms}
    runs: dict[str, list[Path]] = {a: [] for a in arms}
    for seed in args.seeds:
        for arm, extra in arms.items():
            warm_eval = [] if (arm == "K=0" and seed == 1) else ["eval.warm_start=false"]
            slug = arm.replace("=", "").replace(" + ", "_").replace(" ", "_")
            runs[arm].append(run_one("grpo.yaml", seed, args.runs / f"{slug}-seed{seed}",
                                     [*args.overrides, *extra, *warm_eval]))
    rows = {arm: [row_of(p) for p in paths] for arm, paths in runs.items()}
    keys = ["mean@4", "greedy", "staleness_max", "reward_last5", "rl_seconds"]
    lines = ["| arm | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    for arm, rs in rows.items():
        lines.append(f"| {arm} | " + " | ".join(cell([r[k] for r in rs], 100.0 if k in ("mean@4", "greedy") else 1.0)
                                                  for k in keys) + " |")
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = (f"command: `{command}`  \nseeds: {args.seeds} (mean ± standard error over seeds; mean@4 and greedy in "
            f"points, held-out, {next(iter(rows.values()))[0]['n_prompts']} prompts x 4 samples)  \n"
            f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}, machine: {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs")
    (args.out / "table.md").write_text(f"# Asynchronous RL (K = 2) against on-policy (K = 0), the default GRPO job\n\n"
                                       f"{meta}\n\n{table}\n\n")
    (args.out / "table.json").write_text(json.dumps({"rows": rows, "runs": {a: [str(p) for p in ps] for a, ps in runs.items()},
                                                     "seeds": args.seeds, "command": command}, indent=2) + "\n")
    (args.out / "command.txt").write_text(command + "\n")
    print(table)
    evals = {a: {seed: p / "eval_final.json" for seed, p in zip(args.seeds, ps)} for a, ps in runs.items()}
    if "K=0" in evals and len(evals) > 1:
        print(difference_table(args.out, evals, "K=0", k=4))
    plot(args.out, runs)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
