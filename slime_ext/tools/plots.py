"""Plots of a run's `metrics.jsonl`: `python -m slime_ext.tools.plots RUN_DIR/metrics.jsonl [OUT_DIR]`.

One JSON object per line (keys like `step`, `reward/mean`, `eval/mean@1`, `time/train`), read by
`slime_ext.studies.read_metrics` (lines that are not JSON objects are skipped with a warning naming the line; a
record without `step` takes its position among the valid records); unknown keys are ignored, and a figure whose
keys never appear is not written.
Matplotlib is used through its object API on the Agg canvas, so no global backend is switched.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from slime_ext.studies.records import read_metrics

log = logging.getLogger("slime_ext.tools.plots")

Records = list[dict[str, Any]]
PathLike = Union[str, os.PathLike]
TIME_KEYS = ("time/rollout", "time/reward", "time/train", "time/sync")
SMOOTH_MIN_POINTS = 10


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _series(records: Records, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        y = _number(r.get(key))
        if y is not None:
            xs.append(float(r["step"]))
            ys.append(y)
    return xs, ys


def _smooth(ys: Sequence[float]) -> list[float]:
    """Centered moving average over ~1/10 of the points (odd window, shrinking at the edges)."""
    half = max(1, len(ys) // 20)
    return [sum(ys[max(0, i - half): i + half + 1]) / len(ys[max(0, i - half): i + half + 1]) for i in range(len(ys))]


def _figure(title: str, ylabel: str, xlabel: str = "step"):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def _save(fig, out_png: PathLike) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out


def _records(source: Union[PathLike, Records]) -> Records:
    return source if isinstance(source, list) else read_metrics(source)


def plot_series(
    path: Union[PathLike, Records],
    out_png: PathLike,
    keys: Sequence[str],
    title: str,
    ylabel: str,
    points: Sequence[str] = (),
    smooth: bool = True,
    extra_points: Sequence[tuple[str, list[float], list[float]]] = (),
) -> Optional[Path]:
    """Line plot of `keys` against step (thin raw line + bold moving average when there are >= 10 points),
    with `points` keys (sparse values, e.g. eval metrics) as markers. `path` is a metrics.jsonl or its
    records; `extra_points` are (label, xs, ys) markers from elsewhere (held-out evaluations). Returns the PNG
    written, or None when none of the keys has a value."""
    records = _records(path)
    lines = [(k, *_series(records, k)) for k in keys]
    marks = [(k, *_series(records, k)) for k in points] + list(extra_points)
    if not any(xs for _, xs, _ in lines + marks):
        return None
    fig, ax = _figure(title, ylabel)
    for key, xs, ys in lines:
        if not xs:
            continue
        if smooth and len(xs) >= SMOOTH_MIN_POINTS:
            (raw,) = ax.plot(xs, ys, linewidth=0.8, alpha=0.35, label=f"{key} (per step)")
            ax.plot(xs, _smooth(ys), linewidth=2.0, color=raw.get_color(), label=f"{key} (moving avg)")
        else:
            ax.plot(xs, ys, linewidth=1.5, marker="." if len(xs) < 50 else None, label=key)
    for key, xs, ys in marks:
        if xs:
            ax.plot(xs, ys, linestyle="--", marker="o", markersize=6, linewidth=1.0, label=key)
    ax.legend(loc="best", fontsize="small")
    return _save(fig, out_png)


def plot_time_split(path: Union[PathLike, Records], out_png: PathLike, keys: Sequence[str] = TIME_KEYS,
                    title: str = "Time per step by phase") -> Optional[Path]:
    """Stacked seconds per step of `keys` (bars up to 60 steps, stacked areas beyond); missing = 0."""
    records = [r for r in _records(path) if any(_number(r.get(k)) is not None for k in keys)]
    present = [k for k in keys if any(_number(r.get(k)) is not None for r in records)]
    if not present:
        return None
    steps = [float(r["step"]) for r in records]
    values = [[_number(r.get(k)) or 0.0 for r in records] for k in present]
    fig, ax = _figure(title, "seconds")
    labels = [k.split("/", 1)[-1] for k in present]
    if len(steps) <= 60:
        bottom = [0.0] * len(steps)
        gaps = [b - a for a, b in zip(sorted(steps), sorted(steps)[1:]) if b > a]
        width = 0.8 * (min(gaps) if gaps else 1.0)
        for label, ys in zip(labels, values):
            ax.bar(steps, ys, width=width, bottom=bottom, label=label)
            bottom = [b + y for b, y in zip(bottom, ys)]
    else:
        ax.stackplot(steps, values, labels=labels, alpha=0.85)
    top = max(sum(col) for col in zip(*values))
    ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)  # headroom for the legend row
    ax.legend(loc="upper left", fontsize="small", ncol=len(labels))
    return _save(fig, out_png)


def time_shares(records: Records, keys: Sequence[str] = TIME_KEYS) -> tuple[list[float], dict[str, list[float]]]:
    """(steps, {key: each step's share of `keys`' sum}) for the steps that logged any of them; missing = 0."""
    rows = [r for r in _records(records) if any(_number(r.get(k)) is not None for k in keys)]
    steps = [float(r["step"]) for r in rows]
    shares: dict[str, list[float]] = {k: [] for k in keys}
    for r in rows:
        values = {k: _number(r.get(k)) or 0.0 for k in keys}
        total = sum(values.values())
        for k in keys:
            shares[k].append(values[k] / total if total > 0 else 0.0)
    return steps, {k: v for k, v in shares.items() if any(v)}


def plot_time_shares(path: Union[PathLike, Records], out_png: PathLike, keys: Sequence[str] = TIME_KEYS) -> Optional[Path]:
    """Each phase's share of the step, stacked to 100% per step; the median sync share is in the title."""
    steps, shares = time_shares(_records(path), keys)
    if not steps or not shares:
        return None
    sync = sorted(shares.get("time/sync", [0.0]))
    median_sync = sync[len(sync) // 2] if len(sync) % 2 else (sync[len(sync) // 2 - 1] + sync[len(sync) // 2]) / 2
    fig, ax = _figure(f"Share of each step by phase (median sync {median_sync:.1%})", "percent of the step")
    labels = [k.split("/", 1)[-1] for k in shares]
    ax.stackplot(steps, [[100 * v for v in vs] for vs in shares.values()], labels=labels, alpha=0.85)
    ax.set_ylim(0, 115)  # headroom for the legend row
    ax.legend(loc="upper left", fontsize="small", ncol=len(labels))
    return _save(fig, out_png)


@dataclass(frozen=True)
class Figure:
    """One standard figure: what it plots and the title that says exactly that."""

    file: str
    keys: tuple[str, ...]
    title: str
    ylabel: str
    points: tuple[str, ...] = ()
    extra_points: tuple = ()


def _present(records: Records, key: str) -> bool:
    return any(_number(r.get(key)) is not None for r in records)


def held_out_points(run_dir: PathLike, records: Records, metric: str = "mean@1") -> list[tuple[str, list[float], list[float]]]:
    """Held-out `metric` of the run's evaluations as markers: the warm start before step 0 (x = 0) and the
    trained model after the last step (x = last step + 1); empty when the run has no evaluation files."""
    run_dir = Path(run_dir)
    last = max((float(r["step"]) for r in records), default=-1.0)
    points = []
    for name, label, x in (("eval_warm_start.json", "held-out " + metric + ", warm start", 0.0),
                           ("eval_final.json", "held-out " + metric + ", final", last + 1)):
        path = run_dir / name
        if path.exists():
            try:
                value = _number(json.loads(path.read_text()).get(metric))
            except (OSError, ValueError, AttributeError):
                log.warning("%s: not a readable evaluation; left out of the reward plot", path)
                continue
            if value is not None:
                points.append((label, [x], [value]))
    return points


def standard_figures(records: Records, held_out: Sequence[tuple[str, list[float], list[float]]] = ()) -> list[Figure]:
    """The figures of a run, each titled by what its data holds: the reward figure names held-out accuracy
    only when there is some (`eval/mean@1` in the metrics or `held_out` markers), and the KL figure shows the
    KL to the reference (when `grpo.kl_coef > 0`) or else the approximate KL to the rollout policy."""
    has_eval = _present(records, "eval/mean@1") or bool(held_out)
    reward_title = "Mean reward (train rollouts)" + (" and held-out mean@1" if has_eval else "")
    kl = ("train/kl_ref",) if _present(records, "train/kl_ref") else ("train/approx_kl_old",)
    kl_title = ("KL to the reference policy" if kl == ("train/kl_ref",)
                else "Approximate KL to the rollout (old) policy")
    return [
        Figure("reward.png", ("reward/mean",), reward_title, "reward", ("eval/mean@1",), tuple(held_out)),
        Figure("response_length.png", ("response_len/mean",), "Mean response length", "tokens"),
        Figure("kl.png", kl, kl_title, "KL (nats/token)"),
        Figure("entropy.png", ("train/entropy",), "Policy entropy", "nats/token"),
        Figure("throughput.png", ("perf/tokens_per_s",), "Throughput", "tokens/s"),
    ] + (async_figures() if _present(records, "async/engine_idle_frac") else [])


def async_figures() -> list[Figure]:
    """Asynchronous runs (`rollout.max_staleness` >= 1): how far behind the trained tokens were, and who waited."""
    return [
        Figure("staleness.png", ("rollout/staleness_max", "rollout/staleness_mean"),
               "Staleness of trained tokens (trainer minus token version)", "versions behind"),
        Figure("idle.png", ("async/engine_idle_frac", "async/trainer_idle_frac"),
               "Idle share of each step (engines; trainer waiting for its batch)",
               "share of the step"),
    ]


def plot_metrics(metrics_jsonl_path: PathLike, out_dir: PathLike) -> list[Path]:
    """Write the standard figures of a run into `out_dir`; returns the PNGs written (none for an empty file).
    Held-out evaluations beside the metrics file (`eval_warm_start.json`, `eval_final.json`) join the reward
    figure as markers."""
    records = read_metrics(metrics_jsonl_path)
    if not records:
        return []
    out = Path(out_dir)
    held_out = held_out_points(Path(metrics_jsonl_path).parent, records)
    jobs: list[Optional[Path]] = [
        plot_series(records, out / f.file, list(f.keys), f.title, f.ylabel, points=list(f.points),
                    extra_points=list(f.extra_points))
        for f in standard_figures(records, held_out)
    ]
    jobs.append(plot_time_split(records, out / "time_split.png"))
    jobs.append(plot_time_shares(records, out / "time_shares.png"))
    return [p for p in jobs if p is not None]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or len(argv) > 2 or argv[0] in ("-h", "--help"):
        print("usage: python -m slime_ext.tools.plots METRICS_JSONL [OUT_DIR (default: its folder/plots)]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    src = Path(argv[0])
    if not src.is_file():
        print(f"error: {src}: no such file", file=sys.stderr)
        return 2
    paths = plot_metrics(src, argv[1] if len(argv) > 1 else src.parent / "plots")
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
