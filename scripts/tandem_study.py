"""Tandem study: GRPO vs TRL (tandem) vs KL-Reg, judged solo and as a team with a frozen junior.

    python scripts/tandem_study.py [--task v2] [--seeds 0 1 2] [--runs runs/tandem_study_v2] [--out results/tandem_study_v2] [k=v ...]

Each (method, seed) is one main-job run (`configs/tandem_grpo.yaml`, `tandem.yaml`, `tandem_klreg.yaml`) with
`run.seed=SEED`; finished runs are skipped and a run stopped part-way continues from its checkpoint, so an
interrupted study resumes. A run kept complete under `--out`/runs/ (what `results/` holds) is read from there, not
run again, so a study goes on across machines (restore the warm starts it used first:
`python -m slime_ext.tools.warm_start_archive unpack`); `--report-only` runs nothing and tabulates the kept runs,
listing the ones missing.

`--task v2` (the default): task family v2 (configs/tasks/v2.yaml after each config: one step per line, so the arms
share configs/grpo_v2.yaml's warm start of their seed, and the DUET study's too), the SFT seed following the run
seed (arms are compared by their gains over the seed's warm start, results/noise_floor_v2/README.md), RL prompts from
a recurring pool of 256, 1026 held-out prompts for the solo evaluation and for the team evaluation (8 team rollouts
per prompt, handoff pass@1/4/8). The junior is weaker than the senior: the same SFT recipe cut to
`--junior-sft-steps` (default 900 of 1200, chosen by results/tandem_study_v2/pilot: 19.1 mean@4 against the seniors'
22-24; same tokenizer and vocabulary, SFT seed 0 for every seed), built once and
evaluated on the same prompts (a seed run with `--junior-tag` on another machine gets its own rebuild, recorded in
`--out`/runs/juniors.json: SFT on another machine gives other weights); TRL trains beside it, KL-Reg is pulled
towards it, and every arm, GRPO included, is judged against it. Per seed the warm start is evaluated on the same axes
against the junior (the row before RL)
and at T = 0.4 (the noise floor's sharpening baseline). `--task v1` is the committed results/tandem_study (the
default job's level, paragraph steps, SFT seed 0 for every run, the warm start as its own junior).

Writes to `--out`: `table.md` / `table.json` (mean ± std over seeds): solo mean@4 / pass@4 / greedy; team pass@k
and mean under strict alternation and Bernoulli handoffs, senior share, cached share; drift KL from the junior and
its floor (the junior against itself, other sampling seeds), share of tokens drifted by more than 0.2; the junior's
cross-entropy on the senior's outputs and their overlap. Then paired differences against GRPO, prompt by prompt
within seeds, pooled: solo (per-prompt records) and team (per-prompt correct counts of the handoff evaluations). Each
run's small files and gzipped records land under `--out`/runs/ as it finishes; plots: drift survival, training
reward and the senior's token share over steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import keep_run_files, kept_copy, read_metrics  # noqa: E402
from slime_ext.studies.records import RUN_FILES  # noqa: E402
from slime_ext.tools.study import (across_seeds_cell, append_section, command_line, config_on_task,  # noqa: E402
                                   difference_table, eval_checkpoint, evaluation_row, require_on_machine, reuse,
                                   run_one, sharpening_eval, save_figure, shared_seeds, summarise, warm_start_of,
                                   write_table)

METHODS = {"GRPO": "tandem_grpo.yaml", "TRL": "tandem.yaml", "KL-Reg": "tandem_klreg.yaml"}
V2_HELD_OUT = ["data.synthetic.n_eval=1026", "eval.n_prompts=1026"]  # 114 prompts per level V2-V10
TASKS = {
    "v1": {"seeds": [0, 1], "common": [], "suffix": "", "warm_start_per_seed": False, "junior_sft_steps": None,
           "sharpening": None},
    "v2": {"seeds": [0, 1, 2],
           "common": [*V2_HELD_OUT, "rollout.prompt_pool=256", "tandem_axes.prompts=1026", "tandem_axes.n_samples=8",
                      "tandem_axes.k=[1,4,8]"],
           "suffix": "_v2", "warm_start_per_seed": True, "junior_sft_steps": 900, "sharpening": 0.4},
}
WARM, SHARP, JUNIOR = "warm start, no RL (T = 1)", "warm start, no RL, T = {t} (sharpening)", "junior alone"
AXES_FILES = ("tandem_axes.json",)


def arm_overrides(task: str, method: str, junior: Optional[str], extra: Sequence[str]) -> list[str]:
    """The task's keys, and the junior: TRL and KL-Reg train with it (`tandem.junior_path`), every arm is judged
    against it (`tandem_axes.junior_path`; the GRPO baseline's config has no `tandem` section). On v2 each seed's
    warm start is evaluated in the GRPO arm only (the arms share it)."""
    out = list(TASKS[task]["common"])
    if junior is not None:
        out.append(f"tandem_axes.junior_path={junior}")
        if method != "GRPO":
            out.append(f"tandem.junior_path={junior}")
    if TASKS[task]["warm_start_per_seed"] and method != "GRPO":
        out.append("eval.warm_start=false")
    return out + list(extra)


class JuniorNames:
    """Which junior each seed's arms train with and are judged against: `junior_sft<steps>` unless
    `--out`/runs/juniors.json names another for the seed. A junior rebuilt on another machine has other weights (SFT
    rounding differs between machines) under the same cache key, so a seed run with `--junior-tag TAG` gets its own
    folder `junior_sft<steps>TAG`, recorded there; a seed keeps the junior it was first run with."""

    def __init__(self, out: Path, steps: Optional[int], tag: str):
        self.path, self.steps, self.tag = out / "runs" / "juniors.json", steps, tag
        self.by_seed: dict[str, str] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def of(self, seed: int) -> Optional[str]:
        if self.steps is None:
            return None
        default = f"junior_sft{self.steps}"
        recorded = self.by_seed.get(str(seed))
        if not self.tag:
            return recorded or default
        wanted = default + self.tag
        if recorded not in (None, wanted):
            raise SystemExit(f"--junior-tag {self.tag}: seed {seed} was run with the junior {recorded} "
                             f"({self.path}); its arms keep it")
        if recorded is None:
            self.by_seed[str(seed)] = wanted
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.by_seed, indent=1, sort_keys=True) + "\n")
        return wanted


def junior_run(runs: Path, name: str, steps: int, extra: Sequence[str]) -> Path:
    """The weaker junior: configs/grpo_v2.yaml's SFT cut to `steps`, SFT seed 0, then evaluated alone on the held-out
    prompts (`eval_sft.json`); no RL; in `runs/name`. Its warm start is the junior checkpoint (`warm_start_of`)."""
    parent = runs / name
    return run_one(config_on_task("grpo.yaml", "v2", parent), 0, parent,
                   [*V2_HELD_OUT, f"sft.steps={steps}", "run.stages=[data,tokenizer,sft,eval]", *extra])


def warm_axes_eval(run: Path, junior: str, folder: Path) -> Path:
    """The seed's warm start on the same axes as the arms, against the same junior (the row before RL), once:
    `folder/eval_warm.json` and `eval_warm_tandem_axes.json`, with the GRPO arm's config (held-out set, axes keys)."""
    report = folder / "eval_warm.json"
    if report.with_name("eval_warm_tandem_axes.json").exists():
        return report
    folder.mkdir(parents=True, exist_ok=True)
    return eval_checkpoint(warm_start_of(run), run / "config.yaml", report, "--no-progress",
                           then=("--tandem-junior", junior))


def axes_of(report_or_run: Path) -> dict:
    """The axes JSON of a run directory (`tandem_axes.json`) or beside an eval report (`<stem>_tandem_axes.json`)."""
    if report_or_run.is_dir():
        return json.loads((report_or_run / "tandem_axes.json").read_text())
    return json.loads(report_or_run.with_name(report_or_run.stem + "_tandem_axes.json").read_text())


def axes_numbers(axes: dict, eval_report: dict) -> dict[str, float]:
    from slime_ext.methods.tandem.eval_axes import axes_row

    row = {"solo_mean@4": eval_report["mean@4"], "solo_pass@4": eval_report["pass@4"]}
    if eval_report.get("greedy") is not None:
        row["solo_greedy"] = eval_report["greedy"]
    return {**row, **axes_row(axes)}


def row_of(run: Path, axes: dict) -> dict[str, float]:
    row = axes_numbers(axes, json.loads((run / "eval_final.json").read_text()))
    shares = [m["tandem/senior_token_share"] for m in read_metrics(run) if "tandem/senior_token_share" in m]
    if shares:
        row["train_senior_token_share"] = statistics.mean(shares)
    return row


def team_scores(axes: dict, schedule: str, k: int) -> list[float]:
    """Per-prompt pass@k of a handoff evaluation (its per-prompt correct counts), in prompt order."""
    from slime_ext.algo import pass_at_k

    h = axes[f"handoff_{schedule}"]
    if "correct_per_prompt" not in h:
        raise ValueError("this handoff evaluation kept no per-prompt counts (written before they were); cannot pair it")
    return [pass_at_k(h["n_samples"], c, k) for c in h["correct_per_prompt"]]


def team_difference_table(out: Path, arm_axes: dict[str, dict[int, dict]], reference: str, ks: Sequence[int]) -> str:
    """Each arm's team pass@k minus the reference arm's, prompt by prompt within seeds (the same held-out prompts in
    the same order; `arm_axes[arm]` maps a seed to its axes evaluation), pooled over the seeds both arms have: mean ±
    SE and a 95% paired bootstrap interval; under it each seed's difference and a t interval across seeds.
    Appended to `out/table.md`."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference

    lines = [f"## Team (handoff) difference to {reference} (held-out, per-prompt pass@k, paired within seeds)", "",
             "| arm | schedule | " + " | ".join(f"pass@{k}" for k in ks) + " |",
             "| --- | --- | " + " | ".join("---" for _ in ks) + " |"]
    for arm, axes in arm_axes.items():
        if arm == reference:
            continue
        seeds, note = shared_seeds(arm_axes[reference], axes)
        for schedule in ("alternate", "bernoulli"):
            cells = []
            for k in ks:
                a: list[float] = []
                b: list[float] = []
                per_seed: dict[int, float] = {}
                for seed in seeds:
                    ref, this = arm_axes[reference][seed], axes[seed]
                    if ref["n_prompts"] != this["n_prompts"]:
                        raise ValueError(f"{arm}: team evaluations of {this['n_prompts']} and {ref['n_prompts']} "
                                         "prompts; cannot pair them")
                    ref_scores, these = team_scores(ref, schedule, k), team_scores(this, schedule, k)
                    a += ref_scores
                    b += these
                    per_seed[seed] = statistics.fmean(these) - statistics.fmean(ref_scores)
                cells.append(f"{describe_difference(paired_difference(a, b))}{note}<br>{across_seeds_cell(per_seed)}"
                             if a else "-")
            lines.append(f"| {arm} | {schedule} | " + " | ".join(cells) + " |")
    return append_section(out, "\n".join(lines))


def plots(out: Path, first_runs: dict[str, Path], drift: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from slime_ext.methods.tandem.eval_axes import survival_plot

    survival_plot(drift, out / "drift_survival.png")
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.8))
    for m, r in first_runs.items():
        metrics = read_metrics(r)
        ax_r.plot([x["step"] for x in metrics], [x["reward/mean"] for x in metrics], label=m)
        shares = [(x["step"], x["tandem/senior_token_share"]) for x in metrics if "tandem/senior_token_share" in x]
        if shares:
            ax_s.plot(*zip(*shares), label=m)
    ax_r.set(xlabel="RL step", ylabel="training reward")
    ax_s.set(xlabel="RL step", ylabel="senior's share of rollout tokens", title="tandem co-generation")
    ax_r.legend()
    save_figure(fig, out / "reward.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="v2")
    ap.add_argument("--seeds", type=int, nargs="+", help="default: v1 0 1, v2 0 1 2")
    ap.add_argument("--runs", type=Path, help="default: runs/tandem_study (v1), runs/tandem_study_v2 (v2)")
    ap.add_argument("--out", type=Path, help="default: results/tandem_study (v1), results/tandem_study_v2 (v2)")
    ap.add_argument("--junior-sft-steps", type=int, help="v2: SFT steps of the weaker junior (default 900)")
    ap.add_argument("--junior-tag", default="", help="v2: the seeds of this call use their own junior, "
                    "junior_sft<steps><TAG> (a rebuild on another machine: same settings, other weights), recorded in "
                    "--out/runs/juniors.json")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: tabulate the runs that finished (a partial study says which are missing)")
    ap.add_argument("overrides", nargs="*", help="key=value for every run (run-wide sections, tandem_axes.*; not "
                    "tandem.*: the GRPO baseline's config has no tandem section)")
    args = ap.parse_args(argv)
    task = TASKS[args.task]
    args.seeds = args.seeds or task["seeds"]
    args.runs = args.runs or REPO / "runs" / f"tandem_study{task['suffix']}"
    args.out = args.out or REPO / "results" / f"tandem_study{task['suffix']}"
    command = command_line("tandem_study.py", argv)

    baselines: dict[str, dict[int, Path]] = {}  # eval JSONs by seed of what trains nothing
    baseline_axes: dict[str, dict[int, dict]] = {}
    steps = args.junior_sft_steps or task["junior_sft_steps"]
    junior_names = JuniorNames(args.out, steps, args.junior_tag if not args.report_only else "")
    juniors: dict[str, tuple[Optional[str], Optional[Path]]] = {}  # folder name -> (checkpoint, its eval alone)

    def junior_of(seed: int) -> tuple[Optional[str], Optional[Path]]:
        """The seed's junior (built once per folder) and its evaluation alone; (None, None) where there is none."""
        name = junior_names.of(seed)
        if name is None:
            return None, None
        if name not in juniors:
            jrun = reuse(args.out, args.runs / name, args.report_only)
            if jrun is None and not args.report_only:
                jrun = junior_run(args.runs, name, steps, args.overrides)
            juniors[name] = (None, None)
            if jrun is not None:
                juniors[name] = (warm_start_of(jrun), jrun / "eval_sft.json")
                if not args.report_only:
                    require_on_machine(juniors[name][0], f"the junior ({name})")
                keep_run_files(jrun, args.out / "runs" / name)
        return juniors[name]

    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    runs: dict[str, dict[int, Path]] = {m: {} for m in METHODS}  # by seed: pairs only the seeds both arms ran
    arm_axes: dict[str, dict[int, dict]] = {m: {} for m in METHODS}
    first: dict[str, Path] = {}
    missing = []
    for seed in args.seeds:
        junior, junior_eval = junior_of(seed)
        for method, config in METHODS.items():
            parent = args.runs / f"{method}-seed{seed}"
            run = reuse(args.out, parent, args.report_only)
            if run is None and not args.report_only:
                run = run_one(config_on_task(config, args.task, parent), seed, parent,
                              arm_overrides(args.task, method, junior, args.overrides),
                              shared_sft_seed=seed if task["warm_start_per_seed"] else 0)
            if run is None:
                missing.append(f"{method} seed {seed}")
                continue
            keep_run_files(run, args.out / "runs" / parent.name, (*RUN_FILES, *AXES_FILES))
            arm_axes[method][seed] = axes_of(run)
            rows[method].append(row_of(run, arm_axes[method][seed]))
            runs[method][seed] = run
            first.setdefault(method, run)
            if method == "GRPO" and junior_eval is not None:  # the seed's junior alone, paired with its arms
                baselines.setdefault(JUNIOR, {})[seed] = junior_eval
            if method == "GRPO" and task["warm_start_per_seed"] and junior is not None:
                t = task["sharpening"]
                warm_name, sharp_name = f"warm_axes-seed{seed}", f"sharpening_T{t}-seed{seed}"
                warm_kept = kept_copy(args.out, warm_name, "eval_warm_tandem_axes.json")
                sharp_kept = kept_copy(args.out, sharp_name, "eval_sharpening.json")
                if args.report_only and not (warm_kept and sharp_kept):
                    missing.append(f"the warm start's evaluations, seed {seed}")
                    continue
                if warm_kept is not None:
                    warm = warm_kept / "eval_warm.json"
                else:
                    require_on_machine(warm_start_of(run), f"seed {seed}'s warm start")
                    warm = warm_axes_eval(run, junior, args.runs / warm_name)
                    keep_run_files(warm.parent, args.out / "runs" / warm_name,
                                   (warm.name, "eval_warm_tandem_axes.json"))
                baselines.setdefault(WARM, {})[seed] = warm
                baseline_axes.setdefault(WARM, {})[seed] = axes_of(warm)
                if sharp_kept is not None:
                    sharp = sharp_kept / "eval_sharpening.json"
                else:
                    sharp = sharpening_eval(run, t, args.runs / sharp_name)
                    keep_run_files(sharp.parent, args.out / "runs" / sharp_name, (sharp.name,))
                baselines.setdefault(SHARP.format(t=t), {})[seed] = sharp
    if not first:
        print("[study] no finished runs to tabulate")
        return 1
    summary = summarise(rows)
    if task["warm_start_per_seed"]:
        summary.update(summarise({WARM: [axes_numbers(ax, json.loads(baselines[WARM][seed].read_text()))
                                         for seed, ax in baseline_axes.get(WARM, {}).items()]}))
        summary.update(summarise({n: [{f"solo_{k}": v for k, v in evaluation_row(r).items()} for r in rs.values()]
                                  for n, rs in baselines.items() if n != WARM}))
    else:  # v1: the warm start on the same axes, as its own junior (senior = junior)
        warm_hf = Path(axes_of(first["TRL"])["junior"])
        warm_out = args.runs / "warm_start_eval.json"
        if not warm_out.with_name("warm_start_eval_tandem_axes.json").exists():
            eval_checkpoint(warm_hf, first["TRL"] / "config.yaml", warm_out, "--no-progress",
                            then=("--tandem-junior", str(warm_hf)))
        summary = {"warm start": {k: (v, 0.0, 1) for k, v in axes_numbers(axes_of(warm_out), json.loads(
            warm_out.read_text())).items()}} | summary
    keys = list(dict.fromkeys([k for method_rows in rows.values() for row in method_rows for k in row]))
    title = "Tandem study" + (f" (task {args.task})" if args.task != "v1" else " (the warm start is one model)") + (
        f"; not run: {', '.join(missing)}" if missing else "")
    paths = {a: [str(r) for r in rs.values()] for a, rs in {**runs, **baselines}.items()}
    print(write_table(args.out, title, summary, paths, args.seeds, command, keys))
    evals = {m: {seed: run / "eval_final.json" for seed, run in rs.items()} for m, rs in runs.items() if rs}
    if "GRPO" in evals and len(evals) > 1:  # an arm with fewer seeds is paired on the seeds it has, and says so
        print(difference_table(args.out, {**evals, **baselines}, "GRPO"))
        team = {m: axes for m, axes in {**arm_axes, **baseline_axes}.items() if axes}
        if all("correct_per_prompt" in a["handoff_alternate"] for axes in team.values() for a in axes.values()):
            grpo_axes = next(iter(team["GRPO"].values()))
            ks = sorted(int(k.split("@")[1]) for k in grpo_axes["handoff_alternate"] if k.startswith("pass@"))
            print(team_difference_table(args.out, team, "GRPO", ks))
    plot_seed = next(iter(arm_axes["GRPO"] or next((a for a in arm_axes.values() if a), {})), None)
    drift = {m: axes[plot_seed]["drift"] for m, axes in arm_axes.items() if plot_seed in axes}  # one seed's curves
    if plot_seed in baseline_axes.get(WARM, {}):
        warm_axes = baseline_axes[WARM][plot_seed]
        drift[WARM] = warm_axes["drift"]
        if "drift_floor" in warm_axes:
            drift["junior vs itself (floor)"] = warm_axes["drift_floor"]
    plots(args.out, first, drift)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
