"""Tandem study on the embedded default: GRPO vs TRL (tandem) vs KL-Reg, one warm start, several seeds.

    python scripts/tandem_study.py [--seeds 0 1] [--runs runs/tandem_study] [--out results/tandem_study] [k=v ...]

Each (method, seed) is one main-job run (`configs/tandem_grpo.yaml`, `tandem.yaml`, `tandem_klreg.yaml`)
with `run.seed=SEED` and `sft.seed=0`, so all share one cached SFT warm start (paragraph-formatted
data) and differ only in RL sampling. Runs that already finished are skipped, so an interrupted study
resumes. Then the warm start itself is evaluated on the same axes (as senior and junior), and the
table (mean and spread over seeds) with plots goes to `--out`: solo mean@4 / pass@4 / greedy, team
pass@k under strict alternation and Bernoulli handoffs, senior share, drift KL and survival, junior
cross-entropy and overlap. Extra `key=value` overrides apply to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
METHODS = {"GRPO": "tandem_grpo.yaml", "TRL": "tandem.yaml", "KL-Reg": "tandem_klreg.yaml"}


def finished_run(parent: Path) -> Path | None:
    for run in sorted(parent.glob("*/summary.json"), reverse=True):
        if json.loads(run.read_text()).get("complete"):
            return run.parent
    return None


def run_one(config: str, seed: int, parent: Path, overrides: list[str]) -> Path:
    done = finished_run(parent)
    if done is not None:
        print(f"[study] {config} seed {seed}: done earlier ({done})", flush=True)
        return done
    cmd = [sys.executable, "-m", "slime_ext.main", str(REPO / "configs" / config), f"run.seed={seed}", "sft.seed=0",
           f"run.output_dir={parent}", *overrides]
    print(f"[study] {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")})
    run = finished_run(parent)
    if run is None:
        raise RuntimeError(f"{config} seed {seed}: the run ended without a complete summary under {parent}")
    return run


def row_of(run: Path) -> dict[str, float]:
    from slime_ext.tandem_eval import axes_row

    solo = json.loads((run / "eval_final.json").read_text())
    row = {"solo_mean@4": solo["mean@4"], "solo_pass@4": solo["pass@4"], "solo_greedy": solo["greedy"]}
    row.update(axes_row(json.loads((run / "tandem_axes.json").read_text())))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shares = [m["tandem/senior_token_share"] for m in metrics if "tandem/senior_token_share" in m]
    if shares:
        row["train_senior_token_share"] = statistics.mean(shares)
    return row


def summarise(rows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for method, runs in rows.items():
        keys = sorted({k for r in runs for k in r})
        out[method] = {}
        for k in keys:
            vals = [r[k] for r in runs if k in r]
            out[method][k] = (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals))
    return out


def write_outputs(out: Path, summary: dict, runs: dict[str, list[str]], seeds: list[int], command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"summary": summary, "runs": runs, "seeds": seeds}, indent=2) + "\n")
    keys = [k for k in next(iter(summary.values()))]
    for extra in ("train_senior_token_share",):
        if extra not in keys and any(extra in s for s in summary.values()):
            keys.append(extra)
    lines = ["| method | " + " | ".join(keys) + " |", "| --- | " + " | ".join("---" for _ in keys) + " |"]
    for method, stats in summary.items():
        cells = [f"{stats[k][0]:.3f} ± {stats[k][1]:.3f}" if k in stats else "-" for k in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    meta = (f"command: `{command}`  \nseeds: {seeds} (mean ± std over seeds; the warm start is one model)  \n"
            f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}, machine: {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs")
    (out / "table.md").write_text("# Tandem study\n\n" + meta + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


def plots(out: Path, first_runs: dict[str, Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from slime_ext.tandem_eval import survival_plot

    drift = {m: json.loads((r / "tandem_axes.json").read_text())["drift"] for m, r in first_runs.items()}
    survival_plot(drift, out / "drift_survival.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m, r in first_runs.items():
        metrics = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
        ax.plot([x["step"] for x in metrics], [x["reward/mean"] for x in metrics], label=m)
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "tandem_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "tandem_study")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = "python scripts/tandem_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    runs: dict[str, list[str]] = {m: [] for m in METHODS}
    first: dict[str, Path] = {}
    for seed in args.seeds:
        for method, config in METHODS.items():
            run = run_one(config, seed, args.runs / f"{method}-seed{seed}", args.overrides)
            rows[method].append(row_of(run))
            runs[method].append(str(run))
            first.setdefault(method, run)
    # the warm start on the same axes (senior = junior = warm start)
    warm_hf = Path(json.loads((first["TRL"] / "tandem_axes.json").read_text())["junior"])
    warm_out = args.runs / "warm_start_eval.json"
    if not warm_out.with_name("warm_start_eval_tandem_axes.json").exists():
        subprocess.run([sys.executable, "-m", "slime_ext.eval", str(warm_hf), "--config", str(first["TRL"] / "config.yaml"),
                        "--no-progress", "--out", str(warm_out), "--tandem-junior", str(warm_hf)], cwd=REPO, check=True)
    from slime_ext.tandem_eval import axes_row

    warm = json.loads(warm_out.read_text())
    warm_row = {"solo_mean@4": warm["mean@4"], "solo_pass@4": warm["pass@4"], "solo_greedy": warm["greedy"]}
    warm_row.update(axes_row(json.loads(warm_out.with_name("warm_start_eval_tandem_axes.json").read_text())))
    summary = {"warm start": {k: (v, 0.0, 1) for k, v in warm_row.items()}} | summarise(rows)
    write_outputs(args.out, summary, runs, args.seeds, command)
    plots(args.out, first)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
