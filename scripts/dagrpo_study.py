"""DA-GRPO study on the embedded default: continual phases in both orders, lambda starts, a tau change.

    python scripts/dagrpo_study.py [--phase-steps 10] [--control-steps 40] [--control-phase mixed|hard]
                                   [--lambda-starts 0 0.5 1] [--only TEXT ...] [--controls-only] [--runs runs/dagrpo_study]
                                   [--out results/dagrpo_study] [--report-only] [k=v ...]

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
Finished runs are skipped, so an interrupted study resumes. Writes `table1.md` (unless
`--controls-only`), `control[_mixed].md`, `study[_mixed].json` and the plots `cloud_rate[_mixed].png`,
`lambda[_mixed].png` (and the per-level rates of a mixed phase) to `--out`.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.tools.study import finished_run, read_metrics, run_one  # noqa: E402

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
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-steps", type=int, default=10, help="RL steps per phase in the two-phase runs")
    ap.add_argument("--control-steps", type=int, default=40, help="RL steps of the cloud-rate control runs")
    ap.add_argument("--control-phase", choices=sorted(CONTROLS), default="mixed",
                    help="what the control runs train: L1 and L4 interleaved (default) or the hard phase alone")
    ap.add_argument("--lambda-starts", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--controls-only", action="store_true", help="only the cloud-rate control runs")
    ap.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                    help="start only the runs whose name contains one of these (tabulate every finished run): "
                         "lets two processes share the cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "dagrpo_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "dagrpo_study")
    ap.add_argument("--report-only", action="store_true", help="tabulate the finished runs, start nothing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = "python scripts/dagrpo_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
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
