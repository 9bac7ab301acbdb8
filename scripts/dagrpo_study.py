"""DA-GRPO study on the embedded default: continual phases in both orders, lambda starts, a tau change.

    python scripts/dagrpo_study.py [--phase-steps 10] [--control-steps 40] [--control-phase mixed|hard]
                                   [--lambda-starts 0 0.5 1] [--only TEXT ...] [--controls-only] [--runs runs/dagrpo_study]
                                   [--out results/dagrpo_study] [--report-only] [--ask-samples 8] [k=v ...]

Every run starts from one SFT warm start on the L1 and L4 data (with trigger examples; the key ignores
phase order, steps, tau, local_only and how a phase mixes the levels) and asks an exact solver served
over the OpenAI-compatible routes (`dagrpo.cloud_url=solver:synthetic_math_answer`, far stronger than
the local model on L4).

- Table 1 shape, for easy (L1) -> hard (L4) and the reverse: local-only tuning, GRPO with the fixed
  hierarchical reward (collab_grpo) and DA-GRPO: during-task and post-switch accuracy, forgetting,
  local-only / joint accuracy and cloud rate after the last phase, random router and router classifier
  at DA-GRPO's own cloud rate.
- Control: DA-GRPO from several lambda_0 (cloud rate vs tau; settled = the mean training rate over the
  last quarter is within 0.05 of tau), and one run whose tau changes mid-phase. `--control-phase mixed`
  (default) trains on L1 and L4 prompts interleaved, where tau 0.5 is met by asking on L4 only;
  `--control-phase hard` on L4 alone, where every prompt is equally beyond the local model and a rate
  between 0 and 1 needs a mixed policy balanced at lambda = 1 (the first study; it did not settle).
Finished runs are skipped, so an interrupted study resumes (v2: a run kept under `--out`/runs/, finished on another
machine, is read, not run again). Writes `table1.md` (unless
`--controls-only`), `control[_mixed].md`, `study[_mixed].json` and the plots `cloud_rate[_mixed].png`,
`lambda[_mixed].png` (and the per-level rates of a mixed phase) to `--out`.

`--task v2` (the default; `--task v1` is the study above, committed in results/dagrpo_study): task family v2, three
seeds (each its own warm start: the SFT seed follows the run seed), continual phases of mixed levels, "near" (V2-V4,
where the local model is often right) then "far" (V6-V8, where it rarely is), `--phase-steps` each (default 40), tau
0.3 in both, with the settings that held the rate in the v1 control (KL 0.2 to the warm start, normalize_std false, lr
1e-4, eta_lambda 0.05). Arms, in the order they run: DA-GRPO, local-only tuning, and GRPO with a fixed assistance
reward tuned to DA-GRPO's cloud rate: seed 0 runs the reward at each of `--assist-sweep` (0.2 0.5 0.8), the one whose
training cloud rate over the last quarter of the far phase is nearest DA-GRPO's is the arm, and seeds 1 and 2 run it
alone. Every phase evaluation is greedy and sampled (`dagrpo.eval_sampled`, T = eval.temperature) on 1026 held-out
prompts per phase, with the random router and the router classifier at DA-GRPO's own rate. Writes `table.md` /
`table.json` (mean ± std over seeds: during-task and post-switch joint accuracy, forgetting, local-only and joint
accuracy and cloud rate greedy and sampled after the last phase, the routers, the training cloud rate and tau over the
last quarter of each phase), paired differences prompt by prompt against DA-GRPO (joint correctness after the last
phase, greedy, within seeds, pooled), forgetting (each arm's change on the near prompts across the far phase, and its
difference to DA-GRPO's, paired), where each asking arm asks (sampled asks on the prompts its own greedy answer
gets wrong against those it gets right, per level, and the hardest level minus the easiest), each asking arm's
sampled joint accuracy against routers given its sampled cloud rate over greedy local answers (random, hardest level
first, an oracle; the in-run routers sit at the greedy rate, which is 0 in these runs), each asking arm's per-prompt
ask probability from `--ask-samples` sampled answers per held-out prompt of its final model (the AUC of that
probability for the prompts its greedy answer gets wrong, within seeds and within levels;
`eval_checkpoint --dagrpo-ask-samples`, run once per finished asking run that still has its checkpoint: DA-GRPO's
as soon as it finishes, the fixed reward's once the sweep has chosen it, no other sweep point's), and the
same evaluation of each seed's warm start (`--runs`/warm_start-seedN, right after DA-GRPO's): the no-RL rows of the ask table and of a
section of each arm's greedy joint accuracy minus its warm start's, paired per prompt,
`cloud_rate_v2.png`
(training cloud rate and tau over steps, per arm and seed) and `cloud_rate_by_level_v2.png` (the training rate per
level over steps, per asking arm).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, pstdev
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.evaluation import records_path  # noqa: E402
from slime_ext.studies import keep_run_files, level_key, read_metrics, read_records  # noqa: E402
from slime_ext.studies.records import RUN_FILES  # noqa: E402
from slime_ext.methods.dagrpo.ask_probability import ASK_FILE  # noqa: E402
from slime_ext.tools.study import (across_seeds_cell, append_section, command_line, config_on_task,  # noqa: E402
                                   eval_checkpoint, finished_run, reuse, run_one, save_figure, summarise,
                                   warm_start_of, write_table)

# a v2 run's files kept under --out/runs/ (its evaluation records gzipped beside them)
WARM = "warm start (no RL)"
KEPT_FILES = RUN_FILES + ("continual_table.md", "eval_after_phase_0.json", "eval_after_phase_1.json", ASK_FILE)
METHODS = {"local-only": "dagrpo_local_only.yaml", "GRPO + hierarchical reward": "collab_grpo.yaml",
           "DA-GRPO": "dagrpo.yaml"}
EASY, HARD = "{name: easy, levels: [L1], step_limit: 3", "{name: hard, levels: [L4], step_limit: 6"
MIXED = "{name: mixed, levels: [L1, L4], step_limit: 6"
TAU = 0.2


@dataclass(frozen=True)
class ControlDesign:
    """Which phase the cloud-rate control trains, its tau, and the tau change of the schedule run."""
    trained: str  # the phase trained for all the control steps
    tau: float
    change: tuple[float, float]
    describe: str
    evaluated: tuple[str, ...] = ()  # phases of 0 steps: only evaluated
    overrides: tuple[str, ...] = ()  # training settings of this design's runs

    def spec(self, steps: int, tau: float, schedule: str = "") -> str:
        return phases((self.trained, steps, f", tau: {tau}{schedule}"), *((head, 0, "") for head in self.evaluated))


CONTROLS = {
    # the hard task alone: the local model is ~1% right on every prompt, so asking is worth 1 - lambda on
    # every prompt and a rate strictly between 0 and 1 needs a mixed policy held at lambda = 1 exactly
    "hard": ControlDesign(HARD, TAU, (0.4, 0.1), "hard phase (L4) alone", (EASY,)),
    # easy and hard prompts interleaved 1:1: asking pays on L4 (local ~1%) for any lambda < ~0.99 and on
    # L1 (local ~50%) only for lambda < ~0.5, so tau = 0.5 is met by a pure policy (ask on L4 only) over a
    # wide band of lambda
    "mixed": ControlDesign(MIXED, 0.5, (0.5, 0.2), "L1 and L4 prompts interleaved 1:1, GRPO with a KL anchor", (),
                           # the tiny policy's asking decision ignores the prompt (one shared bias), so
                           # without a restoring force it swings between asking always and never (both
                           # absorbing under group-relative advantages); the KL to the warm start makes its
                           # response to lambda smooth (a soft best response) and keeps it off 0 and 1;
                           # eta 0.15 left an underdamped loop (results/dagrpo_study/mixed_eta0.15), so the
                           # dual is slowed to 0.05
                           ("grpo.kl_coef=0.2", "grpo.normalize_std=false", "train.lr=1e-4", "dagrpo.eta_lambda=0.05")),
}


def phases(*specs: tuple[str, int, str]) -> str:
    return "[" + ", ".join(f"{head}, steps: {steps}{extra}}}" for head, steps, extra in specs) + "]"


def control_name(design: str, label: str) -> str:
    return f"control | {label}" if design == "hard" else f"{design} control | {label}"


def plan(phase_steps: int, control_steps: int, lambda_starts: tuple[float, ...] = (0.0, 0.5, 1.0),
         controls_only: bool = False, design: str = "mixed") -> dict[str, tuple[str, list[str]]]:
    """Run name -> (config, overrides)."""
    runs: dict[str, tuple[str, list[str]]] = {}
    orders = {"easy->hard": (EASY, HARD), "hard->easy": (HARD, EASY)}
    for order, (first, second) in ({} if controls_only else orders).items():
        spec = phases((first, phase_steps, f", tau: {TAU}"), (second, phase_steps, f", tau: {TAU}"))
        for method, config in METHODS.items():
            runs[f"{order} | {method}"] = (config, [f"dagrpo.phases={spec}", f"train.steps={2 * phase_steps}"])
    d = CONTROLS[design]
    for lam in lambda_starts:
        spec = d.spec(control_steps, d.tau)
        runs[control_name(design, f"lambda0={lam:g}")] = (
            "dagrpo.yaml", [*d.overrides, f"dagrpo.phases={spec}", f"train.steps={control_steps}", f"dagrpo.lambda_init={lam}"])
    (before, after), half = d.change, control_steps // 2
    spec = d.spec(control_steps, before, f", tau_schedule: [[0, {before}], [{half}, {after}]]")
    runs[control_name(design, f"tau {before:g} -> {after:g}")] = ("dagrpo.yaml", [*d.overrides, f"dagrpo.phases={spec}",
                                                                                   f"train.steps={control_steps}"])
    return runs


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "=." else "_" for c in name).strip("_")


def continual(run: Path, phase_names: list[str]) -> dict[str, float]:
    e0 = json.loads((run / "eval_after_phase_0.json").read_text())
    e1 = json.loads((run / "eval_after_phase_1.json").read_text())
    p0, p1 = phase_names
    during0, post0 = e0[p0]["joint_accuracy"], e1[p0]["joint_accuracy"]
    row = {"during-task acc (1st)": during0, "post-switch acc (1st)": post0,
           "forgetting (1st)": (during0 - post0) / during0 if during0 else float("nan"),
           "during-task acc (2nd)": e1[p1]["joint_accuracy"]}
    for p in phase_names:
        row[f"local-only acc {p}"] = e1[p]["local_only_accuracy"]
        row[f"joint acc {p}"] = e1[p]["joint_accuracy"]
        row[f"cloud rate {p}"] = e1[p]["cloud_rate"]
        for key, label in (("random_router_joint_accuracy", "random router"), ("router_clf_joint_accuracy", "router clf")):
            if key in e1[p]:
                row[f"{label} {p}"] = e1[p][key]
    return row


def control(run: Path, steps: int) -> dict[str, float]:
    """Settled = the mean training cloud rate over the last quarter is within 0.05 of tau; after a tau
    change, `steps to reach the new tau` = steps from the change until the rate's 4-step mean first comes
    within 0.05 of it (nan: never); whether it stays is what `settled` says."""
    import yaml

    m = read_metrics(run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    window = max(1, steps // 4)
    tail = m[-window:]
    rates = [x["dagrpo/cloud_rate"] for x in m]
    rate, tau = mean(rates[-window:]), mean(x["dagrpo/tau"] for x in tail)
    out = {"eta": cfg["dagrpo"]["eta_lambda"], "lr": cfg["train"]["lr"], "kl": cfg["grpo"]["kl_coef"],
           "lambda_0": m[0]["dagrpo/lambda"], "final lambda": m[-1]["dagrpo/lambda_next"],
           "cloud rate (last quarter)": rate, "rate std (last quarter)": pstdev(rates[-window:]),
           "tau (last quarter)": tau, "abs(rate - tau)": abs(rate - tau)}
    for key in sorted({k for x in tail for k in x if k.startswith("dagrpo/cloud_rate/")}):
        out[f"rate {key.rsplit('/', 1)[-1]} (last quarter)"] = mean(x[key] for x in tail)
    taus = [x["dagrpo/tau"] for x in m]
    change = next((i for i in range(1, len(taus)) if taus[i] != taus[i - 1]), None)
    if change is not None:  # the rate over the last quarter before the change
        out["cloud rate before the change"] = mean(rates[max(0, change - window):change])
        out["tau before the change"] = taus[change - 1]
        reach = next((k for k in range(change, len(m) - 3) if abs(mean(rates[k:k + 4]) - taus[k]) <= 0.05), None)
        out["steps to reach the new tau"] = float("nan") if reach is None else float(reach - change)
    out["settled (within 0.05)"] = float(abs(rate - tau) <= 0.05)
    return out


def markdown(rows: dict[str, dict[str, float]]) -> str:
    keys = list(dict.fromkeys(k for r in rows.values() for k in r))
    lines = ["| run | " + " | ".join(keys) + " |", "| --- |" + " ---: |" * len(keys)]
    for name, r in rows.items():
        lines.append(f"| {name.replace('|', '/')} | " + " | ".join("-" if k not in r else f"{r[k]:.3g}" if k in ("lr", "eta", "kl") else f"{r[k]:.3f}" for k in keys) + " |")
    return "\n".join(lines)


def plots(out: Path, control_runs: dict[str, Path], suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name.split("| ")[-1]: read_metrics(run) for name, run in control_runs.items()}
    level_keys = sorted({k for m in runs.values() for x in m for k in x if k.startswith("dagrpo/cloud_rate/")})
    figures = [("dagrpo/cloud_rate", f"cloud_rate{suffix}.png", "cloud rate"),
               ("dagrpo/lambda", f"lambda{suffix}.png", "lambda")]
    figures += [(k, f"cloud_rate_{k.rsplit('/', 1)[-1]}{suffix}.png", f"cloud rate on {k.rsplit('/', 1)[-1]}")
                for k in level_keys]
    for key, fname, label in figures:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, m in runs.items():
            line, = ax.plot([x["step"] for x in m], [x.get(key, float("nan")) for x in m], label=name)
            if key == "dagrpo/cloud_rate":
                ax.plot([x["step"] for x in m], [x["dagrpo/tau"] for x in m], ls="--", color=line.get_color(), lw=0.8)
        ax.set_xlabel("RL step")
        ax.set_ylabel(label)
        ax.set_title(f"DA-GRPO {label}" + (" (dashed: tau)" if key == "dagrpo/cloud_rate" else ""))
        ax.legend()
        save_figure(fig, out / fname)


# -- task family v2 -------------------------------------------------------------------------------------------------
V2_TAU = 0.3
NEAR, FAR = "{name: near, levels: [V2, V3, V4], step_limit: 4", "{name: far, levels: [V6, V7, V8], step_limit: 8"
# the v1 control's settings that held the rate (results/dagrpo_study/control_mixed.md); the phases set their levels in
# equal shares, so v2's level weights are dropped; 1026 held-out prompts per phase, evaluated greedy and sampled
V2_SETTINGS = ["grpo.kl_coef=0.2", "grpo.normalize_std=false", "train.lr=1e-4", "dagrpo.eta_lambda=0.05"]
V2_COMMON = ["data.synthetic.train_level_weights=null", "data.synthetic.n_eval=1026", "eval.n_prompts=1026",
             "dagrpo.eval_sampled=true", "dagrpo.cloud_url=solver:synthetic_math_answer"]
ASSIST = "fixed assistance reward {h:g}"
TUNED = "fixed assistance reward (tuned)"
# DA-GRPO first: a seed stopped part-way has the arm every comparison is made against
V2_ARMS = {"DA-GRPO": "dagrpo.yaml", "local-only": "dagrpo_local_only.yaml"}


def v2_runs(phase_steps: int, assist: tuple[float, ...]) -> dict[str, tuple[str, list[str]]]:
    """Arm -> (config, overrides) of one seed on v2: local-only, DA-GRPO, and the fixed reward at each of `assist`."""
    spec = phases((NEAR, phase_steps, f", tau: {V2_TAU}"), (FAR, phase_steps, f", tau: {V2_TAU}"))
    base = [*V2_COMMON, *V2_SETTINGS, f"dagrpo.phases={spec}", f"train.steps={2 * phase_steps}"]
    runs = {arm: (config, list(base)) for arm, config in V2_ARMS.items()}
    for h in assist:
        runs[ASSIST.format(h=h)] = ("collab_grpo.yaml", [*base, f"dagrpo.hierarchical_reward={h}"])
    return runs


def phase_training_rates(run: Path) -> dict[str, float]:
    """Per phase: the training cloud rate and tau over the last quarter of its steps (`dagrpo/phase` of each row)."""
    m = read_metrics(run)
    out: dict[str, float] = {}
    for k, name in enumerate(("near", "far")):
        rows = [x for x in m if int(x.get("dagrpo/phase", -1)) == k]
        tail = rows[-max(1, len(rows) // 4):]
        if tail:
            out[f"training cloud rate {name} (last quarter)"] = mean(x["dagrpo/cloud_rate"] for x in tail)
            out[f"tau {name} (last quarter)"] = mean(x["dagrpo/tau"] for x in tail)
    return out


def v2_row(run: Path) -> dict[str, float]:
    """One run's table row: the continual measures, the sampled cloud rate and accuracy after the last phase and
    the training rates."""
    row = continual(run, ["near", "far"])
    last = json.loads((run / "eval_after_phase_1.json").read_text())
    for p in ("near", "far"):
        for key, label in (("sampled/cloud_rate", "sampled cloud rate"), ("sampled/joint_accuracy", "sampled joint acc")):
            if key in last[p]:
                row[f"{label} {p}"] = last[p][key]
    return {**row, **phase_training_rates(run)}


def tuned_assist(runs: dict[str, Path], assist: tuple[float, ...]) -> float:
    """The fixed reward whose far-phase training cloud rate (last quarter) is nearest DA-GRPO's."""
    key = "training cloud rate far (last quarter)"
    target = phase_training_rates(runs["DA-GRPO"])[key]
    return min(assist, key=lambda h: abs(phase_training_rates(runs[ASSIST.format(h=h)])[key] - target))


def joint_correct(run: Path) -> dict[tuple[str, str], float]:
    """(phase, prompt id) -> greedy joint correctness after the last phase (its per-prompt records)."""
    out = {}
    for r in read_records(run / "eval_after_phase_1.records.jsonl"):  # gzipped in a run kept under --out/runs/
        if r.get("decoding", "greedy") == "greedy":
            out[(r["phase"], r["prompt_id"])] = float(r["correct"])
    return out


def v2_differences(seed_runs: list[dict[str, Path]], seeds: Sequence[int], reference: str = "DA-GRPO") -> str:
    """Each arm's joint accuracy after the last phase minus DA-GRPO's, paired prompt by prompt within seeds, pooled;
    beside it each seed's difference and a t interval across seeds (`seeds[i]` names `seed_runs[i]`)."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference

    lines = [f"## Difference to {reference} (joint accuracy after the last phase, greedy, per prompt, paired within "
             "seeds)", "", "| arm | difference, points (pooled over prompts) | each seed; across seeds, points |",
             "| --- | --- | --- |"]
    arms = list(dict.fromkeys(a for runs in seed_runs for a in runs if a != reference))
    references = [joint_correct(runs[reference]) if reference in runs else None for runs in seed_runs]  # read once
    for arm in arms:
        a: list[float] = []
        b: list[float] = []
        per_seed: dict[int, float] = {}
        for seed, runs, ref in zip(seeds, seed_runs, references):
            if ref is not None and arm in runs:
                other = joint_correct(runs[arm])
                keys = sorted(ref)
                if sorted(other) != keys:
                    raise ValueError(f"{arm}: {runs[arm]} and {runs[reference]} evaluated different prompts")
                a += [ref[k] for k in keys]
                b += [other[k] for k in keys]
                per_seed[seed] = mean(other[k] - ref[k] for k in keys)
        cells = f"{describe_difference(paired_difference(a, b))} | {across_seeds_cell(per_seed)}" if a else "- | -"
        lines.append(f"| {arm} | {cells} |")
    return "\n".join(lines)


def first_phase_change(run: Path) -> dict[str, float]:
    """Prompt id -> greedy correctness on the first (near) phase's prompts after the last phase minus after the first:
    below 0 where training on the far phase made the arm forget a prompt it had solved."""
    after = []
    for k in (0, 1):
        after.append({r["prompt_id"]: float(r["correct"]) for r in read_records(run / f"eval_after_phase_{k}.records.jsonl")
                      if r["decoding"] == "greedy" and r["phase"] == "near"})
    if sorted(after[0]) != sorted(after[1]):
        raise ValueError(f"{run}: the two phase evaluations scored different near prompts")
    return {k: after[1][k] - after[0][k] for k in after[0]}


def v2_forgetting(seed_runs: list[dict[str, Path]], seeds: Sequence[int], reference: str = "DA-GRPO") -> str:
    """Each arm's change on the near prompts across the far phase (paired over prompts, pooled over seeds) and its
    difference to DA-GRPO's change, paired prompt by prompt within seeds, with each seed's difference and a t
    interval across seeds: forgetting against the baselines."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference

    lines = ["## Forgetting: the near phase's greedy accuracy after the far phase minus after the near phase", "",
             "Per prompt, pooled over seeds; the second column pairs each arm's change with DA-GRPO's on the same "
             "prompts (an arm that asks under greedy decoding is scored on its joint answers), the third gives that "
             "difference seed by seed and a t interval across seeds.", "",
             "| arm | change, points | change minus DA-GRPO's, points | minus DA-GRPO's, each seed; across seeds |",
             "| --- | --- | --- | --- |"]
    arms = list(dict.fromkeys(a for runs in seed_runs for a in runs))
    changes = [{arm: first_phase_change(run) for arm, run in runs.items()} for runs in seed_runs]
    for arm in arms:
        own: list[float] = []
        ref: list[float] = []
        mine_paired: list[float] = []
        per_seed: dict[int, float] = {}
        for seed, per_arm in zip(seeds, changes):
            if arm not in per_arm:
                continue
            own += list(per_arm[arm].values())
            if reference in per_arm and arm != reference:
                keys = sorted(per_arm[reference])
                ref += [per_arm[reference][k] for k in keys]
                mine_paired += [per_arm[arm][k] for k in keys]
                per_seed[seed] = mean(per_arm[arm][k] - per_arm[reference][k] for k in keys)
        change = describe_difference(paired_difference([0.0] * len(own), own))
        versus = (f"{describe_difference(paired_difference(ref, mine_paired))} | {across_seeds_cell(per_seed)}"
                  if ref else "- | -")
        lines.append(f"| {arm} | {change} | {versus} |")
    return "\n".join(lines)


def asks_by_competence(runs: list[Path]) -> dict[str, dict]:
    """Per phase, pooled over `runs` (one per seed): the sampled evaluation's asks after the last phase, split by
    whether the same model's greedy answer to the prompt (which never asked in this study) is wrong or right, and
    by level. A policy that learned *when* to ask asks more where it would be wrong; one that learned only *how
    often* asks alike on both."""
    out: dict[str, dict] = {}
    for run in runs:
        records = read_records(run / "eval_after_phase_1.records.jsonl")
        greedy = {(r["phase"], r["prompt_id"]): float(r["correct"]) for r in records if r["decoding"] == "greedy"}
        for r in records:
            if r["decoding"] != "sampled":
                continue
            phase = out.setdefault(r["phase"], {"wrong": [], "right": [], "levels": {}})
            phase["right" if greedy[(r["phase"], r["prompt_id"])] > 0 else "wrong"].append(float(r["asked"]))
            phase["levels"].setdefault(r["level"], []).append(float(r["asked"]))
    return out


def rate_difference(a: list[float], b: list[float]) -> str:
    """mean(a) - mean(b) of two independent samples of 0/1, in points, with a bootstrap 95% interval."""
    from scipy.stats import bootstrap
    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    diff = 100 * (x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return f"{diff:+.1f} (too few prompts for an interval)"
    ci = bootstrap((x, y), lambda p, q, axis=-1: p.mean(axis=axis) - q.mean(axis=axis), vectorized=True,
                   n_resamples=2000, method="percentile", rng=np.random.default_rng(0)).confidence_interval
    verdict = ", no measured difference" if ci.low <= 0 <= ci.high else ""
    return f"{diff:+.1f} (95% CI {100 * ci.low:+.1f} to {100 * ci.high:+.1f}){verdict}"


def v2_asking(seed_runs: list[dict[str, Path]]) -> str:
    """The section on where each asking arm asks, pooled over seeds."""
    lines = ["## Where each arm asks (sampled evaluation after the last phase, pooled over seeds)", "",
             "Ask rate on the prompts the arm's own greedy answer gets wrong and on those it gets right, their "
             "difference (bootstrap over prompts), the ask rate per level and the hardest level's minus the "
             "easiest's.", "",
             "| arm | phase | asks, greedy wrong | asks, greedy right | wrong - right, points | asks by level | "
             "hardest - easiest level, points |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    arms = list(dict.fromkeys(a for runs in seed_runs for a in runs))
    for arm in arms:
        for phase, split in asks_by_competence([runs[arm] for runs in seed_runs if arm in runs]).items():
            if not any(split["wrong"] + split["right"]):
                continue  # never asks: nothing to split
            wrong, right = split["wrong"], split["right"]
            ordered = sorted(split["levels"].items(), key=lambda kv: level_key(kv[0]))
            levels = ", ".join(f"{lv} {mean(v):.3f}" for lv, v in ordered)
            spread = rate_difference(ordered[-1][1], ordered[0][1]) if len(ordered) > 1 else "-"
            lines.append(f"| {arm} | {phase} | {mean(wrong) if wrong else float('nan'):.3f} ({len(wrong)}) | "
                         f"{mean(right) if right else float('nan'):.3f} ({len(right)}) | "
                         f"{rate_difference(wrong, right)} | {levels} | {spread} |")
    return "\n".join(lines)


def last_phase_answers(run: Path) -> dict[str, dict[str, dict]]:
    """Phase -> prompt id -> {level, greedy local correctness (0 where the greedy answer asked: the in-run
    routers' convention), sampled joint correctness, sampled asked} after the last phase."""
    out: dict[str, dict] = {}
    for r in read_records(run / "eval_after_phase_1.records.jsonl"):
        entry = out.setdefault(r["phase"], {}).setdefault(r["prompt_id"], {"level": r["level"]})
        if r["decoding"] == "greedy":
            entry["local"] = 0.0 if r["asked"] else float(r["correct"])
        else:
            entry["sampled"], entry["asked"] = float(r["correct"]), float(r["asked"])
    return out


def cloud_accuracy(run: Path, phase: str) -> float:
    """The cloud's accuracy on a phase's prompts, as the asking arm's greedy evaluation measured it (its router
    baselines ask the cloud on every prompt; a run without them, the local-only arm, has none)."""
    summary = json.loads((run / "eval_after_phase_1.json").read_text())
    if summary.get(phase, {}).get("cloud_alone_accuracy") is None:
        raise ValueError(f"{run / 'eval_after_phase_1.json'}: phase {phase!r} has no cloud_alone_accuracy (the greedy "
                         "evaluation's router baselines), which the router table needs")
    return summary[phase]["cloud_alone_accuracy"]


def v2_routers(seed_runs: list[dict[str, Path]]) -> str:
    """Each asking arm's sampled joint accuracy after the last phase against routers that send the same share of
    prompts (its sampled cloud rate, per seed and phase) to the cloud and answer the rest with a local model's
    greedy answers: at random, hardest level first, greedy-wrong first (an oracle, the ceiling for that budget),
    and hardest level first over the local-only arm's answers. Routers are expectations over their tie-breaking;
    differences are paired prompt by prompt within seeds, pooled."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference
    from slime_ext.methods.dagrpo.routers import expected_routed_correctness, routing_probabilities

    lines = ["## The asking arms against routers at their own sampled cloud rate (after the last phase, pooled over "
             "seeds)", "",
             "The in-run routers sit at the greedy cloud rate, 0 in these runs, so they equal the local model. Here each "
             "router sends the share of prompts the arm asked on when sampled (per seed and phase) to the cloud and "
             "keeps the rest on a local model's greedy answers; its accuracy is the expectation over how it breaks "
             "ties. A positive difference means the arm's own asking (sampled) beats the router. The difference holds both the "
             "decoding (the arm's sampled local answers against greedy ones) and which prompts go to the cloud; the "
             "section above tests the second alone.", "",
             "| arm | phase | sampled cloud rate | arm's sampled joint acc | router (local answers) | router joint acc | "
             "arm - router, points |", "| --- | --- | --- | --- | --- | --- | --- |"]
    routers = (("random (own greedy)", "own", lambda e: 0.0), ("hardest level first (own greedy)", "own", None),
               ("greedy-wrong first, oracle (own greedy)", "own", lambda e: 1.0 - e["local"]),
               ("hardest level first (local-only's greedy)", "local-only", None))
    arms = [a for a in dict.fromkeys(a for runs in seed_runs for a in runs) if a != "local-only"]
    local_only = [last_phase_answers(runs["local-only"]) if "local-only" in runs else None for runs in seed_runs]
    for arm in arms:
        per_seed = [(runs[arm], last_phase_answers(runs[arm]), base) for runs, base in zip(seed_runs, local_only)
                    if arm in runs]
        for phase in per_seed[0][1]:
            if not any(e["asked"] for _, own, _ in per_seed for e in own[phase].values()):
                continue  # never asks: no budget to give a router
            clouds = [cloud_accuracy(run, phase) for run, _, _ in per_seed]  # read once per seed, not per router
            for label, source, priority in routers:
                arm_scores: list[float] = []
                router_scores: list[float] = []
                rates: list[float] = []
                for (_, own, base), cloud in zip(per_seed, clouds):
                    answers = own if source == "own" else base
                    if answers is None:
                        continue
                    ids = sorted(own[phase])
                    if sorted(answers[phase]) != ids:
                        raise ValueError(f"{arm} and {source}: different {phase} prompts after the last phase")
                    rate = mean(own[phase][i]["asked"] for i in ids)
                    ranks = {lv: k for k, lv in enumerate(sorted({own[phase][i]["level"] for i in ids}, key=level_key))}
                    keys = [priority(answers[phase][i]) if priority else ranks[answers[phase][i]["level"]] for i in ids]
                    p = routing_probabilities(keys, rate)
                    router_scores += expected_routed_correctness([answers[phase][i]["local"] for i in ids],
                                                                 [cloud] * len(ids), p).tolist()
                    arm_scores += [own[phase][i]["sampled"] for i in ids]
                    rates += [rate] * len(ids)
                if not arm_scores:
                    continue
                diff = describe_difference(paired_difference(router_scores, arm_scores))
                lines.append(f"| {arm} | {phase} | {mean(rates):.3f} | {mean(arm_scores):.3f} | {label} | "
                             f"{mean(router_scores):.3f} | {diff} |")
    return "\n".join(lines)


SEED_STYLES = "one line per seed, in --seeds order: solid, dashed, dotted"


def v2_plot(out: Path, seed_runs: list[dict[str, Path]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    dual = ax.twinx()  # the dual variable that moves the rate: DA-GRPO's alone (the other arms keep it at 0)
    arms = list(dict.fromkeys(a for runs in seed_runs for a in runs))
    for i, arm in enumerate(arms):
        for j, runs in enumerate(seed_runs):
            if arm in runs:
                m = read_metrics(runs[arm])
                steps, style = [x["step"] for x in m], {"color": f"C{i}", "ls": ("-", "--", ":")[j % 3]}

                def series(key: str, rows: list[dict] = m) -> list[float]:
                    return [x.get(key, float("nan")) for x in rows]

                ax.plot(steps, series("dagrpo/cloud_rate"), **style, label=f"{arm}" if j == 0 else None)
                ax.plot(steps, series("dagrpo/tau"), color="k", lw=0.6)
                if any(x.get("dagrpo/lambda", 0.0) for x in m):  # the fixed-reward arms log lambda 0 throughout
                    dual.plot(steps, series("dagrpo/lambda"), **style, lw=0.8, alpha=0.5)
    ax.set_xlabel("RL step (near phase, then far)")
    ax.set_ylabel("training cloud rate (black: tau)")
    dual.set_ylabel("lambda (faint lines)")
    if len(seed_runs) > 1:
        ax.set_title(SEED_STYLES, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "cloud_rate_v2.png")


def moving_mean(values: list[float], width: int = 4) -> list[float]:
    """Trailing mean over up to `width` steps (per-level rates of one step rest on ~170 samples each)."""
    return [mean(values[max(0, k - width + 1):k + 1]) for k in range(len(values))]


def v2_level_plot(out: Path, seed_runs: list[dict[str, Path]]) -> Optional[Path]:
    """Training cloud rate per level over steps, one panel per asking arm (seeds as line styles): where the rate
    goes, which is what "learning when to ask" changes; a rate that moves alike on every level is only "how often"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in dict.fromkeys(a for runs in seed_runs for a in runs) if a != "local-only"]
    if not arms:
        return None
    fig, axes = plt.subplots(1, len(arms), figsize=(5 * len(arms), 3.6), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for j, runs in enumerate(seed_runs):
            if arm not in runs:
                continue
            m = read_metrics(runs[arm])
            levels = sorted({k.rsplit("/", 1)[1] for x in m for k in x if k.startswith("dagrpo/cloud_rate/")},
                            key=level_key)
            for i, lv in enumerate(levels):
                rows = [x for x in m if f"dagrpo/cloud_rate/{lv}" in x]
                ax.plot([x["step"] for x in rows], moving_mean([x[f"dagrpo/cloud_rate/{lv}"] for x in rows]),
                        color=f"C{i}", ls=("-", "--", ":")[j % 3], label=lv if j == 0 else None)
            ax.plot([x["step"] for x in m], [x.get("dagrpo/tau", float("nan")) for x in m], color="k", lw=0.6)
        ax.set_title(arm, fontsize=9)
        ax.set_xlabel("RL step (near, then far)")
        ax.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("training cloud rate (4-step mean)")
    seeds = f"; {SEED_STYLES}" if len(seed_runs) > 1 else ""
    fig.suptitle(f"training cloud rate per level (black: tau){seeds}", fontsize=9)
    return save_figure(fig, out / "cloud_rate_by_level_v2.png")


def ask_probability(run: Path, samples: int, kept: Path) -> None:
    """The per-prompt ask probability of a finished asking run's final model (`samples` sampled answers per held-out
    prompt, `eval_checkpoint --dagrpo-ask-samples`), once: skipped when the run has it, or is a kept copy without its
    checkpoint (finished elsewhere)."""
    if not (run / ASK_FILE).exists():
        if not any(run.glob("hf*/config.json")):
            print(f"[study] {run}: no checkpoint here (a kept copy), so no per-prompt ask probability", flush=True)
            return
        eval_checkpoint(run, run / "config.yaml", run / "eval.json", "--dagrpo-ask-samples", str(samples), "--skip-eval")
    keep_run_files(run, kept, KEPT_FILES)  # also when measured earlier, by hand or before the run was kept


def with_interval(summary: dict, name: str, scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
    """`value [low, high]` of a `summarise` statistic and its bootstrap interval (`sign` "+": signed, a difference)."""
    lo, hi = summary[f"{name}_95ci"]
    fmt = f"{sign}.{digits}f"
    return f"{scale * summary[name]:{fmt}} [{scale * lo:{fmt}}, {scale * hi:{fmt}}]"


def ask_records(folder: Optional[Path]) -> list[dict]:
    """The per-prompt ask records of a run or warm-start folder (gzipped in a kept copy); [] where it has none."""
    return read_records(records_path(folder / ASK_FILE)) if folder is not None and (folder / ASK_FILE).exists() else []


def v2_ask_probability(seed_runs: list[dict[str, Path]], warm_starts: Optional[list[Optional[Path]]] = None) -> str:
    """The warm start's and each asking arm's per-prompt ask probability after the last phase (`eval_ask_probability`
    records, pooled over seeds, AUCs within seeds): does it ask where its own greedy answer is wrong?"""
    from slime_ext.methods.dagrpo.ask_probability import summarise

    lines = ["## Per-prompt ask probability (K sampled answers per held-out prompt of the final model, pooled over seeds)",
             "", "p = the share of a prompt's K samples that asked. AUC: how well p ranks the prompts the arm's own greedy "
             "answer gets wrong above those it gets right (0.5: blind to its competence, 1: asks exactly where it would "
             "fail), over pairs within a seed, then within a seed and level (which removes \"harder levels ask more\"); "
             "bootstrap 95% intervals over prompts. In brackets, the shares of prompts at p = 0 and p > 0.5 if every "
             "prompt of a level asked with its level's mean p (binomial): more at the extremes than that means "
             "asking differs between prompts of one level.", "",
             "| arm | phase | prompts x K | mean p | p = 0 / p > 0.5 / p = 1 (by level alone: p = 0 / p > 0.5) | p greedy wrong / right | wrong - right, points | "
             "AUC | AUC within level | p by level |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    arms = [a for a in dict.fromkeys(a for runs in seed_runs for a in runs) if a != "local-only"]
    sources = {WARM: list(warm_starts or [])} | {arm: [runs.get(arm) for runs in seed_runs] for arm in arms}
    found = False
    for arm, folders in sources.items():
        pooled: dict[str, list[dict]] = {}
        for seed, folder in enumerate(folders):
            for r in ask_records(folder):
                pooled.setdefault(r["phase"], []).append({**r, "seed": seed})
        for phase, records in pooled.items():
            found = True
            s = summarise(records, stratum=lambda r: r["seed"])
            levels = ", ".join(f"{lv} {v:.3f}" for lv, v in sorted(s["by_level"].items(), key=lambda kv: level_key(kv[0])))
            lines.append(f"| {arm} | {phase} | {s['prompts']} x {s['samples_per_prompt']} | {s['mean_ask_probability']:.3f} | "
                         f"{s['share_never_asks']:.3f} / {s['share_asks_over_half']:.3f} / {s['share_always_asks']:.3f} "
                         f"({s['share_never_asks_level_alone']:.3f} / {s['share_asks_over_half_level_alone']:.3f}) | "
                         f"{s['ask_probability_greedy_wrong']:.3f} ({s['greedy_wrong']}) / "
                         f"{s['ask_probability_greedy_right']:.3f} ({s['greedy_right']}) | "
                         f"{with_interval(s, 'wrong_minus_right', 100, 1, '+')} | {with_interval(s, 'auc')} | "
                         f"{with_interval(s, 'auc_within_level')} | {levels} |")
    if not found:
        lines.append("| (no run has it yet: `--ask-samples`) | | | | | | | | | |")
    return "\n".join(lines)


def v2_against_warm_start(seed_runs: list[dict[str, Path]], warm_starts: list[Optional[Path]]) -> str:
    """Each arm's greedy joint accuracy after the last phase minus its seed's warm start's (the same greedy evaluation
    of the untrained warm start), paired prompt by prompt within seeds, pooled: what the RL phases added."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference

    lines = [f"## Against the {WARM}: greedy joint accuracy after the last phase minus the warm start's", "",
             "The warm start of each seed evaluated like the arms (greedy local answers, the cloud where it asks), paired "
             "per prompt within seeds and pooled; greedy decoding is the coolest sampler, so this is also the sharpening "
             "baseline of the noise floor (results/noise_floor_v2).", "",
             "| arm | phase | warm start | arm | arm - warm start, points |", "| --- | --- | --- | --- | --- |"]
    warm = [{(r["phase"], r["prompt_id"]): float(r["greedy_correct"]) for r in ask_records(w)} for w in warm_starts]
    if not any(warm):
        return "\n".join(lines + ["| (no warm start evaluated yet: `--ask-samples`) | | | | |"])
    arms = list(dict.fromkeys(a for runs in seed_runs for a in runs))
    for arm in arms:
        pairs = [(runs[arm], joint_correct(runs[arm]), base) for runs, base in zip(seed_runs, warm) if arm in runs and base]
        for phase in ("near", "far"):
            before: list[float] = []
            after: list[float] = []
            for run, joint, base in pairs:
                own = {k: v for k, v in joint.items() if k[0] == phase}
                keys = sorted(own)
                if sorted(k for k in base if k[0] == phase) != keys:
                    raise ValueError(f"{arm}: {run} and its warm start evaluated different {phase} prompts")
                before += [base[k] for k in keys]
                after += [own[k] for k in keys]
            if before:
                lines.append(f"| {arm} | {phase} | {mean(before):.3f} | {mean(after):.3f} | "
                             f"{describe_difference(paired_difference(before, after))} |")
    return "\n".join(lines)


def warm_start_asks(run: Path, samples: int, folder: Path, kept: Path) -> None:
    """The seed's warm start through the arms' per-prompt ask evaluation (greedy and `samples` sampled answers per
    held-out prompt of each phase, the DA-GRPO run's config): the no-RL rows, once per seed, where the warm start is
    on this machine."""
    if (folder / ASK_FILE).exists() or (kept / ASK_FILE).exists():
        if (folder / ASK_FILE).exists():
            keep_run_files(folder, kept, (ASK_FILE,))  # evaluated earlier (by hand, or before a restart)
        return
    try:
        warm = Path(warm_start_of(run))
    except KeyError:
        print(f"[study] {run}: its summary names no warm start, so no {WARM} row", flush=True)
        return
    if not ((warm if warm.is_absolute() else REPO / warm) / "config.json").exists():
        print(f"[study] {warm}: the warm start is not on this machine, so no {WARM} row", flush=True)
        return
    folder.mkdir(parents=True, exist_ok=True)
    eval_checkpoint(warm, run / "config.yaml", folder / "eval.json", "--dagrpo-ask-samples", str(samples), "--skip-eval")
    keep_run_files(folder, kept, (ASK_FILE,))


def found_warm_start(args: argparse.Namespace, seed: int) -> Optional[Path]:
    """Where a seed's warm-start ask evaluation is: under --runs, else its copy kept under --out/runs/."""
    for folder in (args.runs / f"warm_start-seed{seed}", args.out / "runs" / f"warm_start-seed{seed}"):
        if (folder / ASK_FILE).exists():
            return folder
    return None


def require_phase_steps(run: Path, phase_steps: int) -> None:
    """Stop when a run found by name (kept under --out/runs/ or finished under --runs) trained other phase lengths:
    runs are matched by folder name only, and 40-step and 80-step runs must not share one table."""
    import yaml

    config = run / "config.yaml"
    if not config.exists():
        return
    steps = [int(p["steps"]) for p in (yaml.safe_load(config.read_text()).get("dagrpo") or {}).get("phases") or []]
    if steps and any(s != phase_steps for s in steps):
        raise SystemExit(f"{run}: its phases trained {steps} RL steps, this study {phase_steps} (--phase-steps): "
                         "give this length its own --runs and --out")


def measuring(args: argparse.Namespace, arm: str) -> bool:
    """Whether this invocation measures `arm`'s per-prompt ask probability (not in a report, nor for arms `--only`
    leaves out)."""
    return bool(args.ask_samples) and not args.report_only and (args.only is None or any(t in arm for t in args.only))


def measure_dagrpo(args: argparse.Namespace, seed: int, run: Path) -> None:
    """DA-GRPO's per-prompt ask probability and its seed's warm start's (the no-RL rows)."""
    ask_probability(run, args.ask_samples, args.out / "runs" / run.parent.name)
    name = f"warm_start-seed{seed}"
    warm_start_asks(run, args.ask_samples, args.runs / name, args.out / "runs" / name)


def main_v2(args: argparse.Namespace, command: str) -> int:
    assist = tuple(args.assist_sweep)
    seed_runs: list[dict[str, Path]] = []
    warm_starts: list[Optional[Path]] = []
    rows: dict[str, list[dict[str, float]]] = {}
    names: dict[str, list[str]] = {}
    chosen: Optional[float] = None
    missing = []
    for seed in args.seeds:
        sweep = assist if chosen is None else (chosen,)
        done: dict[str, Path] = {}
        for arm, (config, extra) in v2_runs(args.phase_steps, sweep).items():
            parent = args.runs / f"{slug(arm)}-seed{seed}"
            skip = args.report_only or (args.only is not None and not any(t in arm for t in args.only))
            run = reuse(args.out, parent, skip)  # kept under --out/runs/: finished on another machine
            if run is None and not skip:
                run = run_one(config_on_task(config, "v2", parent), seed, parent, [*extra, *args.overrides],
                              shared_sft_seed=seed)
                keep_run_files(run, args.out / "runs" / parent.name, KEPT_FILES)
            if run is None:
                missing.append(f"{arm} seed {seed}")
                continue
            require_phase_steps(run, args.phase_steps)
            done[arm] = run
            if arm == "DA-GRPO" and measuring(args, arm):  # at once: a seed stopped part-way keeps its main arm's asks
                measure_dagrpo(args, seed, run)
        if chosen is None and all(ASSIST.format(h=h) in done for h in assist) and "DA-GRPO" in done:
            chosen = tuned_assist(done, assist)
        if chosen is not None:  # the tuned reward is the arm; the other sweep points stay in the runs list only
            others = {ASSIST.format(h=h) for h in assist} - {ASSIST.format(h=chosen)}
            done = {(TUNED if a == ASSIST.format(h=chosen) else a): r for a, r in done.items() if a not in others}
        if TUNED in done and measuring(args, ASSIST.format(h=chosen)):  # the chosen sweep point only
            ask_probability(done[TUNED], args.ask_samples, args.out / "runs" / done[TUNED].parent.name)
        warm_starts.append(found_warm_start(args, seed))
        seed_runs.append(done)
        for arm, run in done.items():
            rows.setdefault(arm, []).append(v2_row(run))
            names.setdefault(arm, []).append(str(run))
    title = "DA-GRPO study on task family v2: continual near (V2-V4) -> far (V6-V8), tau 0.3"
    if chosen is not None:
        title += f"; fixed assistance reward tuned to DA-GRPO's far-phase cloud rate on seed {args.seeds[0]}: {chosen:g}"
    if missing:
        title += f"; not run: {', '.join(missing)}"
    print(write_table(args.out, title, summarise(rows), names, args.seeds, command))
    append_section(args.out, v2_differences(seed_runs, args.seeds))
    append_section(args.out, v2_forgetting(seed_runs, args.seeds))
    append_section(args.out, v2_asking(seed_runs))
    append_section(args.out, v2_routers(seed_runs))
    append_section(args.out, v2_against_warm_start(seed_runs, warm_starts))
    append_section(args.out, v2_ask_probability(seed_runs, warm_starts))
    if any(seed_runs):
        print(f"[study] plot {v2_plot(args.out, seed_runs)}")
        print(f"[study] plot {v2_level_plot(args.out, seed_runs)}")
    print(f"[study] wrote {args.out / 'table.md'}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("v1", "v2"), default="v2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="v2: the seeds (the first runs the sweep)")
    ap.add_argument("--assist-sweep", type=float, nargs="+", default=[0.2, 0.5, 0.8],
                    help="v2: the fixed assistance rewards tried on the first seed")
    ap.add_argument("--phase-steps", type=int, default=None, help="RL steps per phase (default: v1 10, v2 40)")
    ap.add_argument("--control-steps", type=int, default=40, help="RL steps of the cloud-rate control runs")
    ap.add_argument("--control-phase", choices=sorted(CONTROLS), default="mixed",
                    help="what the control runs train: L1 and L4 interleaved (default) or the hard phase alone")
    ap.add_argument("--lambda-starts", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--controls-only", action="store_true", help="only the cloud-rate control runs")
    ap.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                    help="start only the runs whose name (v2: arm, e.g. DA-GRPO) contains one of these (tabulate "
                         "every finished run): lets two processes share the cores, or a pilot run one arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=Path, help="default: runs/dagrpo_study (v1), runs/dagrpo_study_v2 (v2)")
    ap.add_argument("--out", type=Path, help="default: results/dagrpo_study (v1), results/dagrpo_study_v2 (v2)")
    ap.add_argument("--report-only", action="store_true", help="tabulate the finished runs, start nothing")
    ap.add_argument("--ask-samples", type=int, default=8, metavar="K",
                    help="v2: sampled answers per held-out prompt of each asking arm's final model, for the per-prompt "
                         "ask probability (eval_checkpoint --dagrpo-ask-samples); 0: none (default 8)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = command_line("dagrpo_study.py", argv)
    suffix = "" if args.task == "v1" else "_v2"
    args.runs = args.runs or REPO / "runs" / f"dagrpo_study{suffix}"
    args.out = args.out or REPO / "results" / f"dagrpo_study{suffix}"
    args.phase_steps = args.phase_steps or (10 if args.task == "v1" else 40)
    if args.task == "v2":
        return main_v2(args, command)
    done: dict[str, Path] = {}
    for name, (config, extra) in plan(args.phase_steps, args.control_steps, tuple(args.lambda_starts),
                                      args.controls_only, args.control_phase).items():
        parent = args.runs / slug(name)
        skip = args.report_only or (args.only is not None and not any(t in name for t in args.only))
        run = finished_run(parent) if skip else \
            run_one(config, args.seed, parent, ["dagrpo.cloud_url=solver:synthetic_math_answer", *args.overrides, *extra])
        if run is not None:
            done[name] = run
    table1, ctrl = {}, {}
    for name, run in done.items():
        if "control |" in name:
            ctrl[name] = control(run, args.control_steps)
        else:
            order = name.split(" | ")[0]
            table1[name] = continual(run, order.split("->"))
    args.out.mkdir(parents=True, exist_ok=True)
    design = CONTROLS[args.control_phase]
    suffix = "" if args.control_phase == "hard" else f"_{args.control_phase}"
    what = "tabulated from finished runs by" if args.report_only else "command"
    meta = (f"{what}: `{command}`  \nseed: {args.seed}; date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; "
            f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs  \nphases: easy = L1 (step limit 3), hard = L4 "
            f"(step limit 6), Table 1 tau {TAU}; cloud: exact solver (final answer) over HTTP")
    if table1:
        (args.out / "table1.md").write_text(f"# DA-GRPO continual phases (Table 1 shape)\n\n{meta}\n\n{markdown(table1)}\n")
    (args.out / f"control{suffix}.md").write_text(
        f"# DA-GRPO cloud-rate control ({design.describe}, tau {design.tau:g})\n\n{meta}  \n"
        "eta, lr, kl: each run's dagrpo.eta_lambda, train.lr and grpo.kl_coef (its config.yaml); settled = mean "
        f"training rate over the last quarter within 0.05 of tau\n\n{markdown(ctrl)}\n")
    (args.out / f"study{suffix}.json").write_text(json.dumps({"table1": table1, "control": ctrl,
                                                              "runs": {k: str(v) for k, v in done.items()}}, indent=2) + "\n")
    print(markdown(table1), "\n", markdown(ctrl), sep="\n")
    control_runs = {k: v for k, v in done.items() if "control |" in k}
    if control_runs:
        plots(args.out, control_runs, suffix)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
