"""Asynchronous RL against on-policy, side by side in one run: the GRPO quick job on engine servers at
`rollout.max_staleness` K = 0, 1, 2, 4, equal optimizer steps, one shared SFT warm start.

    python benchmarks/async_rl.py [--quick] [--out DIR] [--ks 0 1 2 4] [--steps N] [--partial] [k=v ...]

Layout: one engine server process (the project's SGLang-protocol server on CPU) and one trainer rank, each one
thread, engines not colocated: the CPU analogue of engines on their own GPUs, where an on-policy step leaves
the engines idle while the trainer trains and the trainer idle while they generate. Per K it reports
generated tokens per second of RL wall time (sum of `time/step`), the largest staleness seen, the mean engine
and trainer idle fractions, and (full mode) held-out mean@4 with per-prompt records and its paired difference
to K = 0. Then the step model (`step_time`) with the measured phase costs, and with the 30B layout's assumed
ones against NeMo-RL's published 1,232 -> 1,522 tok/s/GPU (one step off-policy), as a stated extrapolation.

`--quick` (a few minutes): K = 0, 1, 2, a short SFT, 4 steps of 32 rollouts, no evaluation; writes
`async_quick.json` into `--out`: {"runs": {"0": {"tokens_per_s", "max_staleness_seen", "engine_idle_frac",
"trainer_idle_frac"}, ...}}. Full mode writes `async_rl.json`, `table.md` and the runs under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import fmean
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.before_after import git_state, machine_and_date  # noqa: E402
from slime_ext.studies import read_metrics  # noqa: E402

LAYOUT = ["rollout.engine=sglang", "sglang.num_engines=1", "cluster.colocate=false",
          "train.parallel.data_parallel_size=1", "rollout.threads=1", "train.threads=1"]
QUICK = ["sft.steps=40", "train.steps=4", "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=4",
         "run.stages=[data,tokenizer,sft,rl]", "run.save_every=100"]
FULL = ["eval.warm_start=false"]
# NeMo-RL, Qwen3-30B-A3B on 32 H100: on-policy and one step off-policy tokens/s/GPU (its published figures)
NEMO_ON, NEMO_OFF = 1232.0, 1522.0


def step_time(generate: float, train: float, sync: float, k: int, partial: bool = False) -> float:
    """Seconds per step in steady state. K = 0: the phases take turns. K >= 1, the sync waiting for the
    rollout in flight: generation hides behind training or the reverse, the sync is serial. With partial
    rollouts the engines generate through the sync too (the sync only pauses them; K >= 1)."""
    if k == 0:
        return generate + train + sync
    if partial:
        return max(generate, train + sync)
    return max(generate, train) + sync


def run_k(k: int, out: Path, cache: Path, extra: list[str], partial: bool) -> Path:
    runs = out / "runs" / f"k{k}"
    if runs.exists():
        shutil.rmtree(runs)
    overrides = [f"rollout.max_staleness={k}", f"run.output_dir={runs}", f"run.cache_dir={cache}",
                 f"run.name=async_k{k}", *LAYOUT, *extra]
    if partial and k > 0:
        overrides += ["rollout.partial_rollouts=true", "rollout.stale_tokens=correct"]
    cmd = [sys.executable, "-m", "slime_ext.orchestration.driver", str(REPO / "configs" / "grpo_quick.yaml"),
           *overrides]
    print(f"[async_rl] K={k}: {' '.join(cmd)}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    subprocess.run(cmd, cwd=REPO, check=True, env=env)
    (run,) = [p for p in runs.iterdir() if (p / "metrics.jsonl").exists()]
    return run


def summarise_run(run: Path) -> dict[str, float]:
    rows = read_metrics(run)
    wall = sum(r["time/step"] for r in rows)
    generated = sum(r["rollout/generated_tokens"] for r in rows)
    if "async/engine_idle_frac" in rows[0]:
        engine_idle = fmean(r["async/engine_idle_frac"] for r in rows)
        trainer_idle = fmean(r["async/trainer_idle_frac"] for r in rows)
    else:  # on-policy: the engines idle outside the rollout, the trainer during it
        engine_idle = fmean(1.0 - r["time/rollout"] / r["time/step"] for r in rows)
        trainer_idle = fmean(r["time/rollout"] / r["time/step"] for r in rows)
    out = {"tokens_per_s": generated / wall, "max_staleness_seen": max(r.get("rollout/staleness_max", 0.0) for r in rows),
           "engine_idle_frac": engine_idle, "trainer_idle_frac": trainer_idle, "steps": len(rows),
           "rl_seconds": wall, "generated_tokens": generated,
           "generate_s": fmean(r["time/rollout"] for r in rows), "train_s": fmean(r["time/train"] for r in rows),
           "sync_s": fmean(r.get("time/sync", 0.0) - r.get("time/sync_wait", 0.0) for r in rows),
           "dropped_groups": sum(r.get("async/dropped_groups", 0.0) for r in rows)}
    final = run / "eval_final.json"
    if final.exists():
        report = json.loads(final.read_text())
        out["heldout_mean@4"] = report.get("mean@4")
        out["eval_final"] = str(final)
    return out


def model_table(measured: dict[str, dict[str, float]], partial: bool) -> list[str]:
    """The step model: with the K = 0 run's phase costs (engines and trainer on devices of their own), with each
    run's own phase costs (what sharing the cores did to them), and the 30B layout calibrated to NeMo-RL."""
    base = measured["0"]
    g, t, s = base["generate_s"], base["train_s"], base["sync_s"]
    lines = ["## Step model", "",
             "`step_time`: K = 0 takes generate + train + sync; K >= 1 takes max(generate, train) + sync (the sync "
             "waits for the rollout in flight), or max(generate, train + sync) with partial rollouts.", "",
             f"On-policy phase costs (the K = 0 run, mean per step): generate {g:.2f} s, train {t:.2f} s, sync "
             f"{s:.2f} s. A device per side would keep them when they overlap; here the engine server and the "
             "trainer share two cores, and each run's own phase costs show what overlapping did to them.", "",
             "| K | generate s | train s | predicted, K = 0 costs (own devices) | predicted, own costs | measured |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, row in measured.items():
        own = step_time(g, t, s, 0) / step_time(row["generate_s"], row["train_s"], row["sync_s"], int(k), partial)
        ideal = step_time(g, t, s, 0) / step_time(g, t, s, int(k), partial)
        lines.append(f"| {k} | {row['generate_s']:.2f} | {row['train_s']:.2f} | {ideal:.2f}x | {own:.2f}x | "
                     f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
    # 30B layout: no phase costs of it are measured here. Calibrated to NeMo-RL's published one-step ratio
    # (1,232 -> 1,522 tok/s/GPU): with an assumed 5% sync, the model needs the shorter of generate and train to
    # be 1 - 1232/1522 = 19% of a synchronous step.
    sync30 = 0.05
    short = 1.0 - NEMO_ON / NEMO_OFF
    g30, t30 = 1.0 - sync30 - short, short
    lines += ["", f"30B layout (an extrapolation, not a measurement): a synchronous step split as generate {g30:.0%}, "
              f"train {t30:.0%}, sync {sync30:.0%} (the sync share assumed; generate/train calibrated so that K = 1 "
              f"gives NeMo-RL's published {NEMO_OFF / NEMO_ON:.2f}x on Qwen3-30B-A3B, 32 H100).", "",
              "| K | predicted, sync waits | predicted, partial rollouts |", "| --- | ---: | ---: |"]
    for k in (0, 1, 2, 4):
        waits = step_time(g30, t30, sync30, 0) / step_time(g30, t30, sync30, k)
        part = step_time(g30, t30, sync30, 0) / step_time(g30, t30, sync30, k, partial=k > 0)
        lines.append(f"| {k} | {waits:.2f}x | {part:.2f}x |")
    lines += ["", "The model has no term for K beyond 1: in steady state one rollout is generated per step whatever "
              "K is. A larger K absorbs variation between steps (a long-tailed rollout, a slow step) instead."]
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "async_rl")
    parser.add_argument("--ks", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None, help="RL steps per K (default: 4 quick, 10 full)")
    parser.add_argument("--partial", action="store_true", help="K >= 1 with partial rollouts (stale_tokens correct)")
    parser.add_argument("--cache", type=Path, default=None, help="warm-start cache (default: OUT/cache)")
    parser.add_argument("--report-only", action="store_true", help="rewrite table.md from OUT/async_rl.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args(argv)
    ks = args.ks or ([0, 1, 2] if args.quick else [0, 1, 2, 4])
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = (args.cache or out / "cache").resolve()
    extra = list(QUICK if args.quick else FULL)
    if args.steps is not None:
        extra.append(f"train.steps={args.steps}")
    extra += args.overrides
    if args.report_only:
        saved = json.loads((out / "async_rl.json").read_text())
        write_report(out, saved["runs"], {k: v for k, v in saved.items() if k != "runs"}, ks, args.partial)
        return 0
    runs = {str(k): summarise_run(run_k(k, out, cache, extra, args.partial)) for k in ks}
    for k, row in runs.items():
        print(f"[async_rl] K={k}: {row['tokens_per_s']:.1f} tok/s, staleness seen {row['max_staleness_seen']:.0f}, "
              f"engine idle {row['engine_idle_frac']:.2f}, trainer idle {row['trainer_idle_frac']:.2f}", flush=True)
        if row["max_staleness_seen"] > int(k):
            raise SystemExit(f"K={k}: staleness {row['max_staleness_seen']} seen, above the bound")
    meta = {**machine_and_date(), **git_state(REPO), "command": " ".join([sys.executable, *sys.argv]),
            "layout": LAYOUT, "overrides": extra, "partial_rollouts": args.partial}
    if args.quick:
        path = out / "async_quick.json"
        path.write_text(json.dumps({"runs": runs, **meta}, indent=1))
        print(path)
        return 0
    (out / "async_rl.json").write_text(json.dumps({"runs": runs, **meta}, indent=1))
    write_report(out, runs, meta, ks, args.partial)
    return 0


def write_report(out: Path, runs: dict[str, dict], meta: dict, ks: list[int], partial: bool) -> None:
    """table.md: the measured table, the step model, and the per-prompt paired differences to K = 0."""
    seed = next((o.split("=", 1)[1] for o in meta.get("overrides", []) if o.startswith("run.seed=")), "0")
    base = runs[str(ks[0])]["tokens_per_s"]
    lines = ["# Asynchronous RL: GRPO quick job on an engine server, equal optimizer steps", "",
             f"{meta['date']}, {meta['machine']['uname']}, {meta['machine']['cpus']} CPUs, commit "
             f"{meta['commit'][:10]}; one seed (run.seed {seed}), one engine server and one trainer rank of one thread "
             f"each, {'partial rollouts' if partial else 'the sync waiting for the rollout in flight'}. Command: "
             f"`{meta['command']}`.", "",
             "| K | tokens/s | vs K=0 | max staleness seen | engine idle | trainer idle | held-out mean@4 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, row in runs.items():
        acc = row.get("heldout_mean@4")
        lines.append(f"| {k} | {row['tokens_per_s']:.1f} | {row['tokens_per_s'] / base:.2f}x | "
                     f"{row['max_staleness_seen']:.0f} | {row['engine_idle_frac']:.2f} | {row['trainer_idle_frac']:.2f} | "
                     f"{'-' if acc is None else f'{100 * acc:.1f}'} |")
    lines += [""] + model_table(runs, partial)
    evals = {k: {int(seed): Path(row["eval_final"])} for k, row in runs.items() if "eval_final" in row}
    (out / "table.md").write_text("\n".join(lines) + "\n")
    if len(evals) > 1 and "0" in evals:
        from slime_ext.tools.study import difference_table

        difference_table(out, evals, "0", k=4)
    print((out / "table.md").read_text())


if __name__ == "__main__":
    raise SystemExit(main())
