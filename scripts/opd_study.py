"""How much of a better teacher's lead does on-policy distillation recover? OPD, OPD + reward and GRPO on the
default job, from one warm start, against the teacher's own accuracy.

    python scripts/opd_study.py --teacher RUN_DIR [--seeds 2 3 4] [--runs runs/opd_study] [--out results/opd_study]
                                [--eval-every 10] [k=v ...]

The teacher is a finished run of the default job (`configs/grpo.yaml`) trained from the SFT warm start the arms
start from (`sft.seed=0`, the same `run.cache_dir`): its `eval_final.json` is the ceiling and its
`eval_warm_start.json` the floor, both with per-prompt records, and its `hf/` is `opd.teacher`. Arms, each for the
job's `train.steps` at every seed: `configs/opd.yaml` (pure distillation, `opd.reward_weight=0`), the same with
`opd.reward_weight=1` (distillation beside the task reward's GRPO advantage) and `configs/grpo.yaml`. Every run
evaluates the held-out set every `--eval-every` steps (`eval.every`), which gives the curves and the equal-wall-time
reading. Finished runs are skipped, so an interrupted study resumes.

Equal wall time: an OPD step does what a GRPO step does plus the teacher's scoring; each OPD run measures that
scoring's share of its own step time (`time/score` / `time/step`, side by side in one run: runs one after another on
this machine differ by up to 2x in speed), so at GRPO's cost of `train.steps` steps OPD reaches step
`steps * (1 - share)`; its held-out score there is interpolated linearly between the evaluations either side.

Writes to `--out`: `table.md` / `table.json` (held-out mean@4 and greedy per arm over seeds, training time, the
scoring share, the gap closed), the per-prompt paired differences to GRPO and to the warm start, `curves.png`
(held-out mean@4 over steps and training reward), `runs/` (each run's small files and gzipped per-prompt records,
the teacher's too) and `command.txt`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import fmean

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.evaluation import load_report  # noqa: E402
from slime_ext.studies import keep_run_files, read_metrics  # noqa: E402
from slime_ext.studies.stats import ci_text, t_interval  # noqa: E402
from slime_ext.tools.study import (append_section, command_line, difference_table, run_one, save_figure,  # noqa: E402
                                   summarise, warm_start_of, write_table)

ARMS = {"OPD": ("opd.yaml", ["opd.reward_weight=0"]),
        "OPD + reward": ("opd.yaml", ["opd.reward_weight=1"]),
        "GRPO": ("grpo.yaml", [])}
N_RESAMPLES = 4000
KEYS = ["mean@4", "greedy", "mean@4 at GRPO's wall time", "equal-time step", "scoring share", "reverse_kl_last5",
        "reward_last5", "rl_seconds"]


def slug(arm: str) -> str:
    return arm.replace(" + ", "_").replace(" ", "_")


def held_out_curve(run: Path) -> dict[int, float]:
    """Step -> held-out mean@4: the evaluations between steps and the final one (step = train.steps)."""
    steps = len(read_metrics(run))
    curve = {int(p.stem.removeprefix("eval_step")): json.loads(p.read_text())["mean@4"]
             for p in run.glob("eval_step*.json")}
    curve[steps] = json.loads((run / "eval_final.json").read_text())["mean@4"]
    return dict(sorted(curve.items()))


def scoring_share(run: Path) -> float:
    """The teacher's scoring as a share of this run's step time (0 for an arm without a teacher)."""
    rows = read_metrics(run)
    return sum(r.get("time/score", 0.0) for r in rows) / sum(r["time/step"] for r in rows)


def at_step(curve: dict[int, float], step: float, start: float) -> float:
    """The held-out score at `step`, linear between the evaluations either side (`start` = the warm start's)."""
    xs, ys = [0, *curve], [start, *curve.values()]
    return float(np.interp(step, xs, ys))


def row_of(run: Path, warm_mean4: float) -> dict[str, float]:
    final = json.loads((run / "eval_final.json").read_text())
    metrics = read_metrics(run)
    share = scoring_share(run)
    equal_time_step = len(metrics) * (1.0 - share)
    return {"mean@4": final["mean@4"], "greedy": final["greedy"],
            "mean@4 at GRPO's wall time": at_step(held_out_curve(run), equal_time_step, warm_mean4),
            "equal-time step": equal_time_step, "scoring share": share,
            "reverse_kl_last5": fmean(m.get("opd/reverse_kl", float("nan")) for m in metrics[-5:]),
            "reward_last5": fmean(m["reward/mean"] for m in metrics[-5:]),
            "rl_seconds": sum(m["time/step"] for m in metrics)}


def gap_closed(arm_evals: dict[int, Path], teacher: Path, warm: Path) -> dict:
    """(arm - warm start) / (teacher - warm start) in held-out mean@4, prompts pooled over seeds; a 95% bootstrap
    interval resampling prompts (the same prompts in every seed, the teacher's and warm start's rows with them)."""
    t_report, w_report = load_report(teacher), load_report(warm)
    ids = t_report.prompt_ids()
    t, w = np.array(t_report.prompt_scores(4), float), np.array(w_report.prompt_scores(4), float)
    arms = []
    for seed, path in sorted(arm_evals.items()):
        report = load_report(path)
        if report.prompt_ids() != ids or w_report.prompt_ids() != ids:
            raise ValueError(f"{path}: evaluated other prompts than the teacher {teacher}; cannot pair them")
        arms.append(np.array(report.prompt_scores(4), float))
    a = np.stack(arms)
    ratio = float((a - w).mean() / (t - w).mean())
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(N_RESAMPLES):
        i = rng.integers(0, len(ids), len(ids))
        gap = (t[i] - w[i]).mean()
        if gap != 0:
            boot.append((a[:, i] - w[i]).mean() / gap)
    low, high = np.percentile(boot, [2.5, 97.5])
    per_seed = [float((x - w).mean() / (t - w).mean()) for x in arms]
    return {"gap_closed": ratio, "ci95": [float(low), float(high)], "per_seed": per_seed,
            "teacher_minus_warm": float((t - w).mean())}


def plot(out: Path, runs: dict[str, list[Path]], warm: float, teacher: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for (arm, paths), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
        for i, run in enumerate(paths):
            curve = held_out_curve(run)
            ax1.plot([0, *curve], [100 * warm, *(100 * v for v in curve.values())], "o-", color=color, alpha=0.7,
                     label=arm if i == 0 else None)
            rows = read_metrics(run)
            ax2.plot([r["step"] for r in rows], [r["reward/mean"] for r in rows], color=color, alpha=0.7,
                     label=arm if i == 0 else None)
    ax1.axhline(100 * teacher, color="black", ls="--", label="teacher")
    ax1.axhline(100 * warm, color="grey", ls=":", label="warm start")
    ax1.set(title="Held-out mean@4 (each line one seed)", xlabel="RL step", ylabel="points")
    ax2.set(title="Training reward (each line one seed)", xlabel="RL step", ylabel="reward/mean")
    ax1.legend()
    ax2.legend()
    save_figure(fig, out / "curves.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", type=Path, required=True, help="a finished default-job run directory (its hf/ is "
                                                                 "the teacher; it evaluated its warm start)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "opd_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "opd_study")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = command_line("opd_study.py", argv)
    teacher = args.teacher.resolve()
    teacher_eval, warm_eval = teacher / "eval_final.json", teacher / "eval_warm_start.json"
    for need in (teacher / "hf" / "config.json", teacher_eval, warm_eval):
        if not need.is_file():
            raise SystemExit(f"error: --teacher {teacher}: {need.name} missing ({need}); the teacher must be a "
                             "finished run that evaluated its warm start")
    runs: dict[str, list[Path]] = {a: [] for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            config, extra = ARMS[arm]
            run = run_one(config, seed, args.runs / f"{slug(arm)}-seed{seed}",
                          [*args.overrides, *extra, *([f"opd.teacher={teacher}"] if config == "opd.yaml" else []),
                           f"eval.every={args.eval_every}", "eval.warm_start=false"])
            if warm_start_of(run) != warm_start_of(teacher):
                raise SystemExit(f"error: {run} trained from {warm_start_of(run)}, the teacher from "
                                 f"{warm_start_of(teacher)}: pass the teacher's run.cache_dir and sft keys")
            runs[arm].append(run)
    args.out.mkdir(parents=True, exist_ok=True)
    keep_run_files(teacher, args.out / "runs" / "teacher")
    for arm, paths in runs.items():
        for seed, run in zip(args.seeds, paths):
            keep_run_files(run, args.out / "runs" / f"{slug(arm)}-seed{seed}")
    warm = json.loads(warm_eval.read_text())
    ceiling = json.loads(teacher_eval.read_text())
    rows = {arm: [row_of(p, warm["mean@4"]) for p in paths] for arm, paths in runs.items()}
    rows["teacher (ceiling)"] = [{"mean@4": ceiling["mean@4"], "greedy": ceiling["greedy"]}]
    rows["warm start (floor)"] = [{"mean@4": warm["mean@4"], "greedy": warm["greedy"]}]
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary = summarise(rows)
    write_table(args.out, "On-policy distillation against GRPO, the default job", summary,
                {a: [str(p) for p in ps] for a, ps in runs.items()}, args.seeds, command, keys=KEYS)
    append_section(args.out, f"Held-out: {warm['n_prompts']} prompts x {warm['n_samples']} samples at temperature "
                   f"{warm['temperature']} (mean@4) and greedy, in fractions. Teacher: {teacher} (the default GRPO "
                   "job's result, one run: no spread). Machine: "
                   f"{os.uname().nodename}, {os.cpu_count()} CPUs; rl_seconds differ between runs with the machine's "
                   "load, the scoring share is measured inside each run.")
    evals = {arm: {s: p / "eval_final.json" for s, p in zip(args.seeds, ps)} for arm, ps in runs.items()}
    evals["warm start"] = {s: warm_eval for s in args.seeds}
    evals["teacher"] = {s: teacher_eval for s in args.seeds}
    print(difference_table(args.out, evals, "GRPO", k=4))
    print(difference_table(args.out, evals, "warm start", k=4))
    gaps = {arm: gap_closed(evals[arm], teacher_eval, warm_eval) for arm in runs}
    lines = ["## Share of the teacher's lead over the warm start that each arm closes (held-out mean@4)", "",
             f"teacher - warm start: {100 * next(iter(gaps.values()))['teacher_minus_warm']:+.1f} points on these "
             "prompts. Share = (arm - warm start) / (teacher - warm start), prompts pooled over seeds; 95% bootstrap "
             f"interval over prompts ({N_RESAMPLES} resamples); per seed, and a t interval over seeds.", "",
             "| arm | share closed (95% CI) | per seed | over seeds |", "| --- | --- | --- | --- |"]
    for arm, g in gaps.items():
        lines.append(f"| {arm} | {g['gap_closed']:.2f} [{g['ci95'][0]:.2f}, {g['ci95'][1]:.2f}] | "
                     f"{', '.join(f'{v:.2f}' for v in g['per_seed'])} | "
                     f"{ci_text(t_interval(g['per_seed']), scale=1.0, digits=2)} |")
    print(append_section(args.out, "\n".join(lines)))
    (args.out / "table.json").write_text(json.dumps(
        {"rows": rows, "summary": summary, "gap_closed": gaps, "runs": {a: [str(p) for p in ps] for a, ps in runs.items()},
         "teacher": str(teacher), "seeds": args.seeds, "command": command, "date": date}, indent=2) + "\n")
    (args.out / "command.txt").write_text(command + "\n")
    plot(args.out, runs, warm["mean@4"], ceiling["mean@4"])
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
