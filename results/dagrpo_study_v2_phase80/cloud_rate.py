"""DA-GRPO's training cloud rate per phase, over the whole phase and its last quarter, per seed and with a t interval
across seeds: `python results/dagrpo_study_v2_phase80/cloud_rate.py > results/dagrpo_study_v2_phase80/cloud_rate.md`.

Why: table.md reports the last quarter only, which hides how far the far phase swung above tau before it settled;
the verdict in docs/methods/dagrpo.md cites both from here.
"""

from __future__ import annotations

from pathlib import Path

from slime_ext.studies import read_metrics, t_interval

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
PHASES = ("near", "far")
ABOVE = 0.45  # 1.5 x tau 0.3: a step counted as well above the budget


def phase_rates(run: Path) -> dict[str, list[float]]:
    """Per phase (`dagrpo/phase` 0 = near, 1 = far), the training cloud rate of each RL step in step order."""
    rows = sorted(read_metrics(run), key=lambda m: m["step"])
    return {name: [m["dagrpo/cloud_rate"] for m in rows if int(m["dagrpo/phase"]) == i]
            for i, name in enumerate(PHASES)}


def summary(runs: dict[int, Path]) -> list[str]:
    """Markdown lines: one row per seed and phase, then the across-seed t interval of each phase mean."""
    lines = [f"| seed | phase | steps | whole phase | last quarter | steps above {ABOVE} | peak |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    whole: dict[str, list[float]] = {p: [] for p in PHASES}
    last: dict[str, list[float]] = {p: [] for p in PHASES}
    above_run = []
    for seed, run in runs.items():
        rates = phase_rates(run)
        above_run.append(sum(r > ABOVE for p in PHASES for r in rates[p]))
        for p in PHASES:
            r = rates[p]
            q = r[-(len(r) // 4):]
            whole[p].append(sum(r) / len(r))
            last[p].append(sum(q) / len(q))
            lines.append(f"| {seed} | {p} | {len(r)} | {whole[p][-1]:.3f} | {last[p][-1]:.3f} | "
                         f"{sum(x > ABOVE for x in r)} | {max(r):.3f} |")
    lines += ["", f"Steps above {ABOVE} over the whole run (both phases), per seed: "
              + " / ".join(str(n) for n in above_run) + ".", "",
              "Across seeds (mean ± SE, 95% t interval, 2 degrees of freedom):", ""]
    for p in PHASES:
        for label, values in (("whole phase", whole[p]), ("last quarter", last[p])):
            t = t_interval(values)
            lo, hi = t["ci95"]
            lines.append(f"- {p}, {label}: {t['mean']:.3f} ± {t['se']:.3f} [{lo:.2f}, {hi:.2f}]")
    return lines


def main() -> None:
    runs = {s: HERE / "runs" / f"DA_GRPO-seed{s}" for s in SEEDS}
    print("# DA-GRPO training cloud rate by phase (tau 0.3), seeds 0-2\n")
    print("Written by `python results/dagrpo_study_v2_phase80/cloud_rate.py` from each run's "
          "[metrics.jsonl](runs/DA_GRPO-seed0/metrics.jsonl) (`dagrpo/cloud_rate`: the share of the step's rollouts "
          "that asked). Greedy held-out evaluation asks on no prompt in either phase on any seed "
          "([table.md](table.md), columns `cloud rate far` / `cloud rate near`), so the budget acts in training "
          "only.\n")
    print("\n".join(summary(runs)))


if __name__ == "__main__":
    main()
