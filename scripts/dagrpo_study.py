"""DA-GRPO study on the embedded default: continual phases in both orders, lambda starts, a tau change.

    python scripts/dagrpo_study.py [--phase-steps 10] [--control-steps 24] [--runs runs/dagrpo_study]
                                   [--out results/dagrpo_study] [--report-only] [k=v ...]

Every run starts from one SFT warm start on both phases' data (with trigger examples; the key ignores
phase order, steps, tau and local_only) and asks an exact solver served over the OpenAI-compatible
routes (`dagrpo.cloud_url=solver:synthetic_math_answer`, far stronger than the local model on L4).

- Table 1 shape, for easy (L1) -> hard (L4) and the reverse: local-only tuning, GRPO with the fixed
  hierarchical reward (collab_grpo) and DA-GRPO: during-task and post-switch accuracy, forgetting,
  local-only / joint accuracy and cloud rate after the last phase, random router and router classifier
  at DA-GRPO's own cloud rate.
- Control: DA-GRPO on the hard phase alone from lambda_0 in {0, 0.5, 1} (cloud rate vs tau; settled =
  the mean rate over the last quarter is within 0.05 of tau), and one run whose tau drops mid-phase.
Finished runs are skipped, so an interrupted study resumes. Writes `table1.md`, `control.md`,
`study.json` and `cloud_rate.png` / `lambda.png` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.study import finished_run, read_metrics, run_one  # noqa: E402

METHODS = {"local-only": "dagrpo_local_only.yaml", "GRPO + hierarchical reward": "collab_grpo.yaml",
           "DA-GRPO": "dagrpo.yaml"}
EASY, HARD = "{name: easy, levels: [L1], step_limit: 3", "{name: hard, levels: [L4], step_limit: 6"
TAU = 0.2


def phases(*specs: tuple[str, int, str]) -> str:
    return "[" + ", ".join(f"{head}, steps: {steps}{extra}}}" for head, steps, extra in specs) + "]"


def plan(phase_steps: int, control_steps: int, lambda_starts: tuple[float, ...] = (0.0, 0.5, 1.0),
         controls_only: bool = False) -> dict[str, tuple[str, list[str]]]:
    """Run name -> (config, overrides)."""
    runs: dict[str, tuple[str, list[str]]] = {}
    orders = {"easy->hard": (EASY, HARD), "hard->easy": (HARD, EASY)}
    for order, (first, second) in ({} if controls_only else orders).items():
        spec = phases((first, phase_steps, f", tau: {TAU}"), (second, phase_steps, f", tau: {TAU}"))
        for method, config in METHODS.items():
            runs[f"{order} | {method}"] = (config, [f"dagrpo.phases={spec}", f"train.steps={2 * phase_steps}"])
    # control runs train the hard phase only; the easy phase (0 steps) keeps the shared warm start and
    # is still evaluated
    for lam in lambda_starts:
        spec = phases((HARD, control_steps, f", tau: {TAU}"), (EASY, 0, ""))
        runs[f"control | lambda0={lam:g}"] = ("dagrpo.yaml", [f"dagrpo.phases={spec}", f"train.steps={control_steps}",
                                                              f"dagrpo.lambda_init={lam}"])
    half = control_steps // 2
    spec = phases((HARD, control_steps, f", tau: 0.4, tau_schedule: [[0, 0.4], [{half}, 0.1]]"), (EASY, 0, ""))
    runs["control | tau 0.4 -> 0.1"] = ("dagrpo.yaml", [f"dagrpo.phases={spec}", f"train.steps={control_steps}"])
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
    m = read_metrics(run)
    tail = m[-max(1, steps // 4):]
    rate, tau = mean(x["dagrpo/cloud_rate"] for x in tail), mean(x["dagrpo/tau"] for x in tail)
    out = {"lambda_0": m[0]["dagrpo/lambda"], "final lambda": m[-1]["dagrpo/lambda_next"],
           "cloud rate (last quarter)": rate, "tau (last quarter)": tau, "|rate - tau|": abs(rate - tau)}
    taus = [x["dagrpo/tau"] for x in m]
    change = next((i for i in range(1, len(taus)) if taus[i] != taus[i - 1]), None)
    if change is not None:  # the rate over the last quarter before the change
        before = m[max(0, change - max(1, steps // 4)):change]
        out["cloud rate before the change"] = mean(x["dagrpo/cloud_rate"] for x in before)
        out["tau before the change"] = taus[change - 1]
    out["settled (within 0.05)"] = float(abs(rate - tau) <= 0.05)
    return out


def markdown(rows: dict[str, dict[str, float]]) -> str:
    keys = list(dict.fromkeys(k for r in rows.values() for k in r))
    lines = ["| run | " + " | ".join(keys) + " |", "| --- |" + " ---: |" * len(keys)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join("-" if k not in r else f"{r[k]:.3f}" for k in keys) + " |")
    return "\n".join(lines)


def plots(out: Path, control_runs: dict[str, Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, fname, label in (("dagrpo/cloud_rate", "cloud_rate.png", "cloud rate"), ("dagrpo/lambda", "lambda.png", "lambda")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, run in control_runs.items():
            m = read_metrics(run)
            line, = ax.plot([x["step"] for x in m], [x[key] for x in m], label=name.split("| ")[-1])
            if key == "dagrpo/cloud_rate":
                ax.plot([x["step"] for x in m], [x["dagrpo/tau"] for x in m], ls="--", color=line.get_color(), lw=0.8)
        ax.set_xlabel("RL step (hard phase)")
        ax.set_ylabel(label)
        ax.set_title(f"DA-GRPO {label}" + (" (dashed: tau)" if key == "dagrpo/cloud_rate" else ""))
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-steps", type=int, default=10, help="RL steps per phase in the two-phase runs")
    ap.add_argument("--control-steps", type=int, default=24, help="RL steps of the hard-phase control runs")
    ap.add_argument("--lambda-starts", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--controls-only", action="store_true", help="only the hard-phase control runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "dagrpo_study")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "dagrpo_study")
    ap.add_argument("--report-only", action="store_true", help="tabulate the finished runs, start nothing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    command = "python scripts/dagrpo_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
    done: dict[str, Path] = {}
    for name, (config, extra) in plan(args.phase_steps, args.control_steps, tuple(args.lambda_starts),
                                      args.controls_only).items():
        parent = args.runs / slug(name)
        run = finished_run(parent) if args.report_only else \
            run_one(config, args.seed, parent, ["dagrpo.cloud_url=solver:synthetic_math_answer", *args.overrides, *extra])
        if run is not None:
            done[name] = run
    table1, ctrl = {}, {}
    for name, run in done.items():
        if name.startswith("control"):
            ctrl[name] = control(run, args.control_steps)
        else:
            order = name.split(" | ")[0]
            table1[name] = continual(run, order.split("->"))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = (f"command: `{command}`  \nseed: {args.seed}; date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; "
            f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs  \nphases: easy = L1 (step limit 3), hard = L4 "
            f"(step limit 6), tau {TAU}; cloud: exact solver (final answer) over HTTP")
    (args.out / "table1.md").write_text(f"# DA-GRPO continual phases (Table 1 shape)\n\n{meta}\n\n{markdown(table1)}\n")
    (args.out / "control.md").write_text(f"# DA-GRPO cloud-rate control (hard phase)\n\n{meta}\n\n{markdown(ctrl)}\n")
    (args.out / "study.json").write_text(json.dumps({"table1": table1, "control": ctrl,
                                                     "runs": {k: str(v) for k, v in done.items()}}, indent=2) + "\n")
    print(markdown(table1), "\n", markdown(ctrl), sep="\n")
    control_runs = {k: v for k, v in done.items() if k.startswith("control")}
    if control_runs:
        plots(args.out, control_runs)
    print(f"[study] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
