"""DUET study: GRPO (full and reduced rollouts) vs DUET at 100/50/25% budget vs DAPO.

    python scripts/duet_study.py [--task v2] [--seeds 0 1 2] [--runs runs/duet_study_v2] [--out results/duet_study_v2]
                                 [--arms ARM ...] [--report-only] [k=v ...]

`--task v2` (the default): task family v2 (configs/tasks/v2.yaml after each arm's config: levels V2-V10 in one
weighted pool, responses up to 480 tokens, so DUET's grace and DAPO's overlong buffer are scaled to it), the SFT
seed following the run seed (each seed its own warm start, the one configs/grpo_v2.yaml trains: arms are compared
by their gains over it, results/noise_floor_v2/README.md), 1026 held-out prompts (the warm start evaluated in
the GRPO arm only), a DUET 50% arm with `duet.n_min=2`, and DUET 50% / 25% run for full GRPO's wall clock
(74 / 117 steps: accuracy at equal time). `--task v1` is the committed results/duet_study (the default job's level L2, SFT seed 0 for every
run, 256 held-out prompts). Every arm draws RL prompts from one recurring pool of 256 training prompts
(`rollout.prompt_pool`) and differs only in the method and `run.seed`. Finished runs are skipped and a run
stopped part-way continues from its last checkpoint, so an interrupted study resumes; a run kept complete under
`--out`/runs/ (what `results/` holds) is read from there, not run again, so a study goes on across machines;
`--report-only` runs nothing and rebuilds the tables and plots from those kept runs alone. Writes to `--out`: `table.md` / `table.json` (held-out mean@4, pass@4, greedy,
generated tokens per step, wall-clock per step, steps and seconds to the target training reward (v2: what the
seed's full GRPO arm ended at), speed-ups against full GRPO; DUET 50% (and n_min 2) paired with uniform half rollouts, the same tokens; on v2 also each seed's warm start at T = 1 and at
T = 0.4, the noise floor's sharpening baseline, results/noise_floor_v2), each run's config, metrics, reports and
gzipped per-prompt records under `--out`/runs/ (written as each run finishes), and plots of lambda, K1/K2, n_q fan-out, abort / marker / tail-trim rates over steps and the
allocation per level (`duet_allocation_by_level.png`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import keep_run_files, kept_copy, kept_run, read_metrics  # noqa: E402
from slime_ext.tools.study import (command_line, config_on_task, difference_table, evaluation_row,  # noqa: E402
                                   finished_run, run_one, save_figure, sharpening_eval, summarise,
                                   write_table)

ARMS = {
    "GRPO full": ("grpo.yaml", []),
    "GRPO x0.5 rollouts": ("grpo.yaml", ["rollout.n_samples_per_prompt=4"]),
    "DUET 100%": ("duet.yaml", ["duet.budget_fraction=1.0"]),
    "DUET 50%": ("duet.yaml", ["duet.budget_fraction=0.5"]),
    "DUET 25%": ("duet.yaml", ["duet.budget_fraction=0.25"]),
    "DAPO": ("dapo.yaml", []),
}


# Every arm draws RL prompts from the same recurring pool (an epoch every 4 steps at 64 prompts per
# step), which DUET's per-prompt statistics need; with the full 20k-prompt set no prompt recurs within a
# short run and DUET's allocation stays uniform (n_q = 8 for every prompt at 100%).
COMMON = ["rollout.prompt_pool=256"]

# Per task: the default seeds, what every arm adds, arms only that task runs, the folders' suffix, whether each seed
# trains its own warm start (then evaluated in the GRPO arm only, as the arms share it; else SFT seed 0 for every run),
# and the time-to-target training reward (None: the seed's full GRPO arm's final reward, `final_reward`).
TASKS = {
    "v1": {"seeds": [0, 1], "common": [], "extra_arms": {}, "suffix": "", "warm_start_per_seed": False, "target": 0.7,
           "sharpening": None},
    # grace and overlong buffer x3 with max_response_len (160 -> 480); 1026 = 114 held-out prompts per level
    "v2": {"seeds": [0, 1, 2],
           "common": ["duet.grace=48", "dapo.overlong_buffer=96", "data.synthetic.n_eval=1026", "eval.n_prompts=1026"],
           "extra_arms": {"DUET 50% n_min 2": ("duet.yaml", ["duet.budget_fraction=0.5", "duet.n_min=2"]),
                          # accuracy at equal wall clock: DUET run for as many seconds as full GRPO's 40 steps, i.e.
                          # 40 x full GRPO's / DUET's seconds per step on seed 0 (34.1 / 18.4 and 34.1 / 11.6 s,
                          # results/duet_study_v2/table.md), fixed in advance so every seed runs the same steps.
                          # With a constant learning rate its first 40 steps are the 40-step arm's, whose
                          # evaluation is the curve's middle point.
                          "DUET 50% equal time": ("duet.yaml", ["duet.budget_fraction=0.5", "train.steps=74"]),
                          "DUET 25% equal time": ("duet.yaml", ["duet.budget_fraction=0.25", "train.steps=117"])},
           "suffix": "_v2", "warm_start_per_seed": True, "target": None,
           # the noise floor's sharpening baseline (results/noise_floor_v2): each seed's warm start sampled cooler
           "sharpening": 0.4},
}
WARM, SHARP = "warm start, no RL (T = 1)", "warm start, no RL, T = {t} (sharpening)"
# The arms that generate about half of full GRPO's tokens per step at 40 steps: DUET's allocation against uniform
# half rollouts at the same budget, paired in a second difference table.
UNIFORM_HALF = "GRPO x0.5 rollouts"
SAME_TOKENS = [UNIFORM_HALF, "DUET 50%", "DUET 50% n_min 2"]


def arm_overrides(task: str, arm: str, config: str, overrides: list[str]) -> list[str]:
    """The task's common keys that apply to this arm's method (a DUET key on a GRPO run would be rejected); on v2
    the seed's warm start is evaluated in the GRPO arm only (the arms share it)."""
    method = Path(config).stem
    common = [o for o in TASKS[task]["common"] if not o.startswith(("duet.", "dapo.")) or o.startswith(method + ".")]
    if TASKS[task]["warm_start_per_seed"] and arm != "GRPO full":
        common.append("eval.warm_start=false")
    return common + overrides


def final_reward(run: Path) -> float:
    """The run's training reward over its last 5 steps: on v2 the time-to-target target is the seed's full GRPO
    arm's (when each arm reaches what full GRPO ended at), since v2's rewards sit far from v1's 0.7."""
    return mean(m["reward/mean"] for m in read_metrics(run)[-5:])


def row_of(run: Path, target: float) -> dict[str, float]:
    final = json.loads((run / "eval_final.json").read_text())
    metrics = read_metrics(run)
    reward = [m["reward/mean"] for m in metrics]
    times = [m["time/step"] for m in metrics]
    # first step whose trailing 5-step training reward reaches the target, and the seconds spent by then
    smooth = [mean(reward[max(0, i - 4): i + 1]) for i in range(len(reward))]
    hit = next((i for i, r in enumerate(smooth) if r >= target), None)
    evaluation = {k: final[k] for k in ("mean@4", "pass@4", "greedy") if final.get(k) is not None}  # greedy: optional
    return {
        **evaluation,
        **phase_rates(metrics),
        "tokens_per_step": mean(m["rollout/generated_tokens"] for m in metrics),
        "seconds_per_step": mean(times),
        "rl_seconds": float(sum(times)),  # the RL steps' wall clock (evaluations aside): the equal-time arms' check
        "steps_to_target": float(hit + 1) if hit is not None else float("nan"),
        "seconds_to_target": float(sum(times[: hit + 1])) if hit is not None else float("nan"),
    }


def phase_rates(metrics: list[dict]) -> dict[str, float]:
    """Milliseconds per generated token in the rollout phase and per trained token in the train phase: seconds per
    step follow the machine's speed on the day as much as the arm's tokens, and these rates tell the two apart (an
    arm equally fast per token in both phases differs only in what it generates). Empty for metrics without them."""
    out = {}
    for name, seconds, tokens in (("rollout_ms_per_token", "time/rollout", "rollout/generated_tokens"),
                                  ("train_ms_per_token", "time/train", "train/tokens")):
        if all(seconds in m and m.get(tokens) for m in metrics):
            out[name] = 1000 * sum(m[seconds] for m in metrics) / sum(m[tokens] for m in metrics)
    return out


def plots(out: Path, duet_runs: dict[str, Path], all_runs: dict[str, Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("duet/lambda", "lambda"), ("duet/k1", "K1"), ("duet/k2", "K2"), (None, "n_q fan-out (min / mean / max)"),
              ("duet/abort_rate", "abort rate"), ("duet/marker_rate", "marker rate"),
              ("duet/tail_trim_rate", "tail-trim rate (the gate ended it after the answer)"),
              ("duet/tokens_over_budget", "generated / budget tokens")]
    duet_metrics = {name: read_metrics(run) for name, run in duet_runs.items()}  # read once for every panel
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5))
    for ax, (key, label) in zip(axes.flat, panels):
        for name, m in duet_metrics.items():
            steps = [x["step"] for x in m]
            if key is None:  # the allocation's spread of rollouts per prompt
                line, = ax.plot(steps, [x["duet/n_mean"] for x in m], label=name)
                ax.fill_between(steps, [x["duet/n_min"] for x in m], [x["duet/n_max"] for x in m],
                                color=line.get_color(), alpha=0.15)
            else:
                ax.plot(steps, [x.get(key, float("nan")) for x in m], label=name)
        ax.set_title(label)
        ax.set_xlabel("RL step")
    axes.flat[0].legend()
    save_figure(fig, out / "duet_controller.png")

    # where each budget goes on a mixed-level pool: mean rollouts per prompt of every level over steps
    levels = sorted({k.rsplit("/", 1)[1] for m in duet_metrics.values() for x in m for k in x if k.startswith("duet/n_mean/")},
                    key=lambda v: (len(v), v))
    if levels:
        fig, axes = plt.subplots(1, len(duet_metrics), figsize=(4 * len(duet_metrics), 3.8), sharey=True, squeeze=False)
        for ax, (name, m) in zip(axes[0], duet_metrics.items()):
            for level in levels:
                ax.plot([x["step"] for x in m], [x.get(f"duet/n_mean/{level}", float("nan")) for x in m], label=level)
            ax.set(title=name, xlabel="RL step")
        axes[0][0].set_ylabel("rollouts per prompt (mean)")
        axes[0][-1].legend(fontsize=7, ncol=2)
        save_figure(fig, out / "duet_allocation_by_level.png")

    # what each arm spends and what it gets for it
    fig, (ax_tok, ax_rew) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, run in all_runs.items():
        m = read_metrics(run)
        tokens = [x["rollout/generated_tokens"] for x in m]
        cumulative = [sum(tokens[: i + 1]) / 1e6 for i in range(len(tokens))]
        ax_tok.plot([x["step"] for x in m], tokens, label=name)
        ax_rew.plot(cumulative, [x["reward/mean"] for x in m], label=name)
    ax_tok.set(title="generated tokens per step", xlabel="RL step")
    ax_rew.set(title="training reward vs tokens generated", xlabel="cumulative generated tokens (M)")
    ax_tok.legend(fontsize=8)
    save_figure(fig, out / "duet_tokens.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="v2")
    ap.add_argument("--seeds", type=int, nargs="+", help="default: v1 0 1, v2 0 1 2")
    ap.add_argument("--runs", type=Path, help="default: runs/duet_study (v1), runs/duet_study_v2 (v2)")
    ap.add_argument("--out", type=Path, help="default: results/duet_study (v1), results/duet_study_v2 (v2)")
    ap.add_argument("--target", type=float, help="training-reward target for time-to-target; default: v1 0.7, v2 the "
                    "seed's full GRPO arm's reward over its last 5 steps")
    ap.add_argument("--arms", nargs="+", metavar="ARM", help="only these arms (quoted names, e.g. 'DUET 50%%'), "
                    "plus full GRPO, which every other arm is measured against; default: all")
    ap.add_argument("--report-only", action="store_true", help="run nothing: tabulate the runs kept under --out/runs/")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    task = TASKS[args.task]
    suffix = task["suffix"]
    args.seeds = args.seeds or task["seeds"]
    args.runs = args.runs or REPO / "runs" / f"duet_study{suffix}"
    args.out = args.out or REPO / "results" / f"duet_study{suffix}"
    arms = {**ARMS, **task["extra_arms"]}
    if args.arms:  # full GRPO always: the reference of every difference, speed-up and target
        unknown = [a for a in args.arms if a not in arms]
        if unknown:
            raise SystemExit(f"--arms: unknown arm(s) {unknown}; the {args.task} arms are {list(arms)}")
        arms = {a: v for a, v in arms.items() if a == "GRPO full" or a in args.arms}
    fixed_target = args.target if args.target is not None else task["target"]
    if args.report_only and args.overrides:
        raise SystemExit("--report-only runs nothing, so it takes no overrides "
                         f"(got {' '.join(args.overrides)}): the kept runs' config.yaml say what they ran")
    command = command_line("duet_study.py", argv)
    find_kept = kept_run if args.report_only else kept_copy  # --report-only: a missing kept run is an error
    rows: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    runs: dict[str, dict[int, Path]] = {a: {} for a in arms}  # by seed, for the paired differences
    first: dict[str, Path] = {}
    baselines: dict[str, dict[int, Path]] = {}  # the task's baselines: an eval JSON by seed
    for seed in args.seeds:
        for arm, (config, extra) in arms.items():
            slug = arm.replace(" ", "_").replace("%", "pct").replace(".", "")
            parent = args.runs / f"{slug}-seed{seed}"
            kept = find_kept(args.out, parent.name)
            if args.report_only:
                run = kept
            elif kept is not None and finished_run(parent) is None:  # finished on another machine, kept in results/
                print(f"[study] {arm} seed {seed}: kept earlier in {kept}, not run again (delete it to rerun)", flush=True)
                run = kept
            else:
                overrides = arm_overrides(args.task, arm, config, [*COMMON, *args.overrides, *extra])  # the arm wins
                run = run_one(config_on_task(config, args.task, parent), seed, parent, overrides,
                              shared_sft_seed=seed if task["warm_start_per_seed"] else 0)
            if arm == "GRPO full":  # the first arm of every seed
                target = fixed_target if fixed_target is not None else final_reward(run)
                if task["warm_start_per_seed"]:  # the seed's own baselines: its warm start, plain and cooled
                    baselines.setdefault(WARM, {})[seed] = run / "eval_warm_start.json"
                if task["sharpening"] is not None:
                    t = task["sharpening"]
                    folder = f"sharpening_T{t}-seed{seed}"
                    name = "eval_sharpening.json"
                    kept_sharp = find_kept(args.out, folder, name)
                    if kept_sharp is not None:
                        sharp = kept_sharp / name
                    else:
                        sharp = sharpening_eval(run, t, args.runs / folder)
                        keep_run_files(sharp.parent, args.out / "runs" / folder, (sharp.name,))
                    baselines.setdefault(SHARP.format(t=t), {})[seed] = sharp
            keep_run_files(run, args.out / "runs" / parent.name)  # each finished run lands as it finishes
            rows[arm].append({**row_of(run, target), "target_reward": target})
            runs[arm][seed] = run
            first.setdefault(arm, run)
    summary = summarise(rows)
    full = summary["GRPO full"]
    for arm, stats in summary.items():  # speed-ups against full GRPO (ratios of means)
        n = min(stats["tokens_per_step"][2], full["tokens_per_step"][2])
        stats["token_saving"] = (1 - stats["tokens_per_step"][0] / full["tokens_per_step"][0], 0.0, n)
        stats["step_speedup"] = (full["seconds_per_step"][0] / stats["seconds_per_step"][0], 0.0, n)
    summary.update(summarise({name: [evaluation_row(r) for r in reports.values()] for name, reports in baselines.items()}))
    paths = {a: [str(r) for r in rs.values()] for a, rs in {**runs, **baselines}.items()}
    print(write_table(args.out, "DUET study", summary, paths,
                      args.seeds, command,
                      ["mean@4", "pass@4", "greedy", "tokens_per_step", "token_saving", "seconds_per_step",
                       "step_speedup", "rl_seconds", "rollout_ms_per_token", "train_ms_per_token", "steps_to_target",
                       "seconds_to_target"]))
    evals = {a: {seed: run / "eval_final.json" for seed, run in rs.items()} for a, rs in runs.items()}
    print(difference_table(args.out, {**evals, **baselines}, "GRPO full"))
    same_tokens = [a for a in SAME_TOKENS if a in evals]  # DUET's claim: a better use of the same tokens
    if UNIFORM_HALF in evals and len(same_tokens) > 1:
        print(difference_table(args.out, {UNIFORM_HALF: evals[UNIFORM_HALF], **{a: evals[a] for a in same_tokens}},
                               UNIFORM_HALF))
    plots(args.out, {a: r for a, r in first.items() if a.startswith("DUET")}, first)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
