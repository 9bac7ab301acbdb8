"""Tandem study on the embedded default: GRPO vs TRL (tandem) vs KL-Reg, one warm start, several seeds.

    python scripts/tandem_study.py [--seeds 0 1] [--runs runs/tandem_study] [--out results/tandem_study] [k=v ...]

Each (method, seed) is one main-job run (`configs/tandem_grpo.yaml`, `tandem.yaml`, `tandem_klreg.yaml`)
with `run.seed=SEED` and `sft.seed=0`, so all share one cached SFT warm start (paragraph-formatted
data) and differ only in RL sampling. Runs that already finished are skipped, so an interrupted study
resumes. Then the warm start itself is evaluated on the same axes (as senior and junior), and the
table (mean and spread over seeds) with plots goes to `--out`: solo mean@4 / pass@4 / greedy, team
pass@k under strict alternation and Bernoulli handoffs, senior share, drift KL and survival, junior
cross-entropy and overlap. Extra `key=value` overrides apply to every run, so they may set the run-wide
sections and `tandem_axes.*` (e.g. `tandem_axes.prompts=128`), not `tandem.*` (the GRPO baseline's config has no
`tandem` section: a run's config holds its own method's sections only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.tools.study import difference_table, finished_run, read_metrics, run_one, summarise, write_table  # noqa: E402

METHODS = {"GRPO": "tandem_grpo.yaml", "TRL": "tandem.yaml", "KL-Reg": "tandem_klreg.yaml"}


def row_of(run: Path) -> dict[str, float]:
    from slime_ext.methods.tandem.eval_axes import axes_row

    solo = json.loads((run / "eval_final.json").read_text())
    row = {"solo_mean@4": solo["mean@4"], "solo_pass@4": solo["pass@4"], "solo_greedy": solo["greedy"]}
    row.update(axes_row(json.loads((run / "tandem_axes.json").read_text())))
    shares = [m["tandem/senior_token_share"] for m in read_metrics(run) if "tandem/senior_token_share" in m]
    if shares:
        row["train_senior_token_share"] = statistics.mean(shares)
    return row


def plots(out: Path, first_runs: dict[str, Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from slime_ext.methods.tandem.eval_axes import survival_plot

    drift = {m: json.loads((r / "tandem_axes.json").read_text())["drift"] for m, r in first_runs.items()}
    survival_plot(drift, out / "drift_survival.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m, r in first_runs.items():
        metrics = read_metrics(r)
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
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: tabulate the runs that finished (a partial study says which are missing)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = "python scripts/tandem_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    runs: dict[str, list[str]] = {m: [] for m in METHODS}
    first: dict[str, Path] = {}
    missing = []
    for seed in args.seeds:
        for method, config in METHODS.items():
            parent = args.runs / f"{method}-seed{seed}"
            run = finished_run(parent) if args.report_only else run_one(config, seed, parent, args.overrides)
            if run is None:
                missing.append(f"{method} seed {seed}")
                continue
            rows[method].append(row_of(run))
            runs[method].append(str(run))
            first.setdefault(method, run)
    # the warm start on the same axes (senior = junior = warm start)
    warm_hf = Path(json.loads((first["TRL"] / "tandem_axes.json").read_text())["junior"])
    warm_out = args.runs / "warm_start_eval.json"
    if not warm_out.with_name("warm_start_eval_tandem_axes.json").exists():
        subprocess.run([sys.executable, "-m", "slime_ext.tools.eval_checkpoint", str(warm_hf), "--config", str(first["TRL"] / "config.yaml"),
                        "--no-progress", "--out", str(warm_out), "--tandem-junior", str(warm_hf)], cwd=REPO, check=True)
    from slime_ext.methods.tandem.eval_axes import axes_row

    warm = json.loads(warm_out.read_text())
    warm_row = {"solo_mean@4": warm["mean@4"], "solo_pass@4": warm["pass@4"], "solo_greedy": warm["greedy"]}
    warm_row.update(axes_row(json.loads(warm_out.with_name("warm_start_eval_tandem_axes.json").read_text())))
    summary = {"warm start": {k: (v, 0.0, 1) for k, v in warm_row.items()}} | summarise(rows)
    keys = list(warm_row) + ["train_senior_token_share"]
    title = "Tandem study (the warm start is one model)" + (f"; not run: {', '.join(missing)}" if missing else "")
    print(write_table(args.out, title, summary, runs, args.seeds, command, keys))
    complete = {m: [Path(r) / "eval_final.json" for r in rs] for m, rs in runs.items() if len(rs) == len(args.seeds)}
    if "GRPO" in complete and len(complete) > 1:
        print(difference_table(args.out, complete, "GRPO"))
    plots(args.out, first)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
