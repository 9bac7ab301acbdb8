"""SxS study on the embedded default: standard CoT SFT -> RL vs SxS SFT -> RL, accuracy and latency.

    python scripts/sxs_study.py [--seeds 0] [--runs runs/sxs_study] [--out results/sxs_study] [--report-only] [k=v ...]

Runs per seed (main-job runs, `run.seed=SEED`, `sft.seed=0`; finished runs are skipped, so an
interrupted study resumes):
- `cot`: `configs/grpo.yaml` (SFT warm start on the plain `Step k:` ... `\\boxed{N}` solutions, then GRPO);
  its `eval_warm_start.json` is the "CoT SFT" row, its `eval_final.json` the "CoT SFT->RL" row;
- `sxs_sft`: `configs/sxs_sft.yaml` (SFT on the same task's solutions interleaved by Algorithm 1,
  `sxs.interleave_data`), `eval_sft.json` -> "SxS SFT";
- `sxs_rl`, `sxs_rl_shaping`: `configs/sxs_rl.yaml` with `sxs.qp_shaping=false` / `true`, RL from that same
  SxS warm start (same cache key as `sxs_sft`; the study checks the recorded warm-start paths agree),
  `eval_final.json` -> "SxS SFT->RL" / "SxS SFT->RL +shaping".
Both arms start from the same base (the tiny model, random init, the same SFT settings and seed); each
arm's embedded tokenizer is trained on its own SFT text.

Columns (`--out`/table.md, table.json; mean ± std over seeds): held-out mean@4 / pass@4 / greedy, the
truncation rate, and the latency metrics of `slime_ext.methods.sxs.metrics` averaged over the sampled eval
responses (`meta.response_metrics` of the eval json): ARI, ABO, AIRW, think blocks, total / reasoning /
response lengths, first substantive disclosure, all in tokens of the response without its EOS. For the
CoT rows the same metrics treat the `Step` reasoning as one think block and the final `\\boxed{}` line
as the only speak block (`cot_channels`). Plot `block_count.png`: think blocks per rollout (`sxs/think_blocks`)
and training accuracy (`reward/correct`; GRPO: `reward/mean`) over RL steps. `k=v` overrides apply to
every run (so not `sxs.*`: the CoT arm is a grpo run, whose config has no `sxs` section).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.tools.study import difference_table, finished_run, read_metrics, run_one, summarise, write_table  # noqa: E402

# run slug -> (config, extra overrides); arm -> (run slug, eval json of that run)
RUNS = {
    "cot": ("grpo.yaml", []),
    "sxs_sft": ("sxs_sft.yaml", []),
    "sxs_rl": ("sxs_rl.yaml", ["sxs.qp_shaping=false"]),
    "sxs_rl_shaping": ("sxs_rl.yaml", ["sxs.qp_shaping=true"]),
}
ARMS = {
    "CoT SFT": ("cot", "eval_warm_start.json"),
    "CoT SFT->RL": ("cot", "eval_final.json"),
    "SxS SFT": ("sxs_sft", "eval_sft.json"),
    "SxS SFT->RL": ("sxs_rl", "eval_final.json"),
    "SxS SFT->RL +shaping": ("sxs_rl_shaping", "eval_final.json"),
}
RL_CURVES = {"CoT SFT->RL": "cot", "SxS SFT->RL": "sxs_rl", "SxS SFT->RL +shaping": "sxs_rl_shaping"}
ACCURACY = {"mean@4": "mean@4", "pass@4": "pass@4", "greedy": "greedy", "truncated": "truncation_rate"}
LATENCY = {"ARI": "ari", "ABO": "abo", "AIRW": "airw", "think_blocks": "think_blocks", "total_len": "total_len",
           "reasoning_len": "reasoning_len", "response_len": "response_len", "first_disclosure": "first_disclosure"}
KEYS = [*ACCURACY, *LATENCY]


def row_of(run: Path, eval_name: str) -> dict[str, float]:
    """Table row from one eval json of a run: accuracy keys and `meta.response_metrics` (NaN skipped)."""
    report = json.loads((run / eval_name).read_text())
    row = {k: float(report[src]) for k, src in ACCURACY.items() if report.get(src) is not None}
    latency = report.get("meta", {}).get("response_metrics", {})
    for k, src in LATENCY.items():
        value = latency.get(src)
        if value is not None and value == value:
            row[k] = float(value)
    return row


def warm_start_of(run: Path) -> Optional[str]:
    return json.loads((run / "summary.json").read_text()).get("stages", {}).get("sft", {}).get("warm_start")


def check_same_warm_start(runs: dict[str, Path]) -> str:
    """The SxS runs must share one warm start (the SxS SFT weights); returns its path."""
    starts = {slug: warm_start_of(run) for slug, run in runs.items() if slug.startswith("sxs")}
    if len(set(starts.values())) != 1 or None in starts.values():
        raise RuntimeError(f"the SxS runs do not share one SFT warm start: {starts}")
    return next(iter(starts.values()))


def curve(run: Path, *keys: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the first of `keys` each metrics.jsonl row has (NaN when none)."""
    m = read_metrics(run)
    values = [next((float(x[k]) for k in keys if k in x), float("nan")) for x in m]
    return [x["step"] for x in m], values


def plots(out: Path, curves: dict[str, list[Path]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (blocks, acc) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (arm, runs) in enumerate(curves.items()):  # one colour per arm, one line style per seed
        for j, run in enumerate(runs):
            style = {"color": f"C{i}", "linestyle": ("-", "--", ":", "-.")[j % 4],
                     "label": arm if len(runs) == 1 else f"{arm} ({run.parent.name})"}
            if not arm.startswith("CoT"):
                blocks.plot(*curve(run, "sxs/think_blocks"), **style)
            acc.plot(*curve(run, "reward/correct", "reward/mean"), **style)
    blocks.set_title("think blocks per rollout")
    acc.set_title("training accuracy (visible answer)")
    for ax in (blocks, acc):
        ax.set_xlabel("RL step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "block_count.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "sxs_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "sxs_study")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: tabulate the runs that finished (a partial study says which are missing)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = "python scripts/sxs_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    runs: dict[str, list[str]] = {a: [] for a in ARMS}
    curves: dict[str, list[Path]] = {a: [] for a in RL_CURVES}
    missing, warm_starts = [], []
    for seed in args.seeds:
        done: dict[str, Path] = {}
        for slug, (config, extra) in RUNS.items():
            parent = args.runs / f"{slug}-seed{seed}"
            run = finished_run(parent) if args.report_only else run_one(config, seed, parent, [*args.overrides, *extra])
            if run is None:
                missing.append(f"{slug} seed {seed}")
                continue
            done[slug] = run
        if all(s in done for s in RUNS if s.startswith("sxs")):
            warm_starts.append(check_same_warm_start(done))
        for arm, (slug, eval_name) in ARMS.items():
            if slug in done:
                rows[arm].append(row_of(done[slug], eval_name))
                runs[arm].append(str(done[slug]))
        for arm, slug in RL_CURVES.items():
            if slug in done:
                curves[arm].append(done[slug])
    summary = summarise({a: r for a, r in rows.items() if r})
    title = "SxS study: standard CoT vs SxS, SFT and SFT -> RL (latency in tokens)"
    if missing:
        title += f"; not run: {', '.join(missing)}"
    table = write_table(args.out, title, summary, {a: r for a, r in runs.items() if r}, args.seeds, command, KEYS)
    for before, after in (("CoT SFT", "CoT SFT->RL"), ("SxS SFT", "SxS SFT->RL"), ("SxS SFT->RL", "SxS SFT->RL +shaping")):
        if runs.get(before) and len(runs[before]) == len(runs.get(after, [])):  # what RL (or shaping) adds, paired
            evals = {arm: [Path(r) / ARMS[arm][1] for r in runs[arm]] for arm in (before, after)}
            print(difference_table(args.out, evals, before))
    if warm_starts:
        (args.out / "sxs_warm_starts.json").write_text(json.dumps(warm_starts, indent=2) + "\n")
    print(table)
    if any(curves.values()):
        print(f"[study] plot {plots(args.out, {a: c for a, c in curves.items() if c})}")
    print(f"[study] wrote {args.out / 'table.md'} and {args.out / 'table.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
