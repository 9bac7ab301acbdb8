"""Run plots from metrics.jsonl: the six figures, malformed lines reported, missing keys and empty files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from slime_ext.studies import read_metrics
from slime_ext.tools.plots import plot_metrics, plot_series

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ["reward.png", "response_length.png", "kl.png", "entropy.png", "throughput.png", "time_split.png",
           "time_shares.png"]


def write_metrics(path: Path, steps: int = 20, bad_line_at: int | None = 8, drop: tuple[str, ...] = ()) -> Path:
    lines = []
    for s in range(steps):
        rec = {
            "step": s,
            "reward/mean": 0.2 + 0.03 * s,
            "response_len/mean": 120 - 2 * s,
            "train/kl_ref": 0.001 * s,
            "train/entropy": 1.5 - 0.02 * s,
            "perf/tokens_per_s": 900 + 5 * s,
            "time/rollout": 3.0, "time/reward": 0.2, "time/train": 1.5, "time/sync": 0.1,
            "some/unknown_key": "ignored",
        }
        if s % 5 == 4:
            rec["eval/mean@1"] = 0.25 + 0.02 * s
        for k in drop:
            rec.pop(k, None)
        lines.append(json.dumps(rec))
        if s == bad_line_at:
            lines.append('{"step": 9, "reward/mean": 0.5')  # truncated JSON
    path.write_text("\n".join(lines) + "\n")
    return path


def check_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert 300 <= h <= 2000 and 500 <= w <= 3000, (path, img.shape)
    assert img[..., :3].std() > 0.01  # not a blank canvas


def test_seven_figures_and_malformed_line_reported(tmp_path, caplog):
    src = write_metrics(tmp_path / "metrics.jsonl")
    with caplog.at_level(logging.WARNING, logger="slime_ext.studies"):
        paths = plot_metrics(src, tmp_path / "plots")
    assert sorted(p.name for p in paths) == sorted(FIGURES)
    for p in paths:
        assert p.parent == tmp_path / "plots"
        check_png(p)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{src}:10:" in warnings[0] and "not valid JSON" in warnings[0]
    records = read_metrics(src)
    assert len(records) == 20 and [r["step"] for r in records] == list(range(20))


def test_missing_keys_are_not_plotted_and_empty_file_gives_nothing(tmp_path):
    src = write_metrics(tmp_path / "m.jsonl", bad_line_at=None,
                        drop=("train/kl_ref", "time/rollout", "time/reward", "time/train", "time/sync"))
    paths = plot_metrics(src, tmp_path / "out")
    assert sorted(p.name for p in paths) == sorted(set(FIGURES) - {"kl.png", "time_split.png", "time_shares.png"})
    assert not (tmp_path / "out" / "kl.png").exists()

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert plot_metrics(empty, tmp_path / "none") == []
    assert not (tmp_path / "none").exists()
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n[1, 2]\n\n")
    assert plot_metrics(junk, tmp_path / "none") == []
    with pytest.raises(FileNotFoundError):
        plot_metrics(tmp_path / "absent.jsonl", tmp_path / "none")


def test_plot_series_helper_and_many_steps(tmp_path):
    src = write_metrics(tmp_path / "m.jsonl", steps=150, bad_line_at=None)
    out = plot_series(src, tmp_path / "x.png", ["reward/mean", "train/entropy"], "Two series", "value")
    assert out == tmp_path / "x.png"
    check_png(out)
    assert plot_series(src, tmp_path / "y.png", ["nope/key"], "Nothing", "value") is None
    assert not (tmp_path / "y.png").exists()
    paths = plot_metrics(src, tmp_path / "plots")  # 150 steps: time split as stacked areas
    assert len(paths) == 7
    check_png(tmp_path / "plots" / "time_split.png")


def test_titles_say_what_the_figures_hold(tmp_path):
    """The reward figure names held-out accuracy only when the run has some; the KL figure shows the KL to the
    reference when it was computed, else the approximate KL to the rollout policy (the default, kl_coef 0)."""
    from slime_ext.tools.plots import held_out_points, standard_figures

    plain = [{"step": s, "reward/mean": 0.5, "train/approx_kl_old": 1e-6} for s in range(5)]
    figs = {f.file: f for f in standard_figures(plain)}
    assert figs["reward.png"].title == "Mean reward (train rollouts)"
    assert figs["kl.png"].keys == ("train/approx_kl_old",) and "rollout" in figs["kl.png"].title
    with_ref = [dict(r, **{"train/kl_ref": 0.01}) for r in plain]
    assert {f.file: f for f in standard_figures(with_ref)}["kl.png"].title == "KL to the reference policy"

    (tmp_path / "eval_warm_start.json").write_text(json.dumps({"mean@1": 0.62}))
    (tmp_path / "eval_final.json").write_text(json.dumps({"mean@1": 0.65}))
    points = held_out_points(tmp_path, plain)
    assert points == [("held-out mean@1, warm start", [0.0], [0.62]), ("held-out mean@1, final", [5.0], [0.65])]
    assert standard_figures(plain, points)[0].title == "Mean reward (train rollouts) and held-out mean@1"
    src = tmp_path / "metrics.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in plain))
    paths = {p.name for p in plot_metrics(src, tmp_path / "plots")}
    assert {"reward.png", "kl.png"} <= paths  # the default job's metrics now give a KL figure too


def test_time_shares_per_step():
    from slime_ext.tools.plots import time_shares

    records = [{"step": 0, "time/rollout": 3.0, "time/reward": 0.5, "time/train": 6.0, "time/sync": 0.5},
               {"step": 1, "time/rollout": 1.0, "time/train": 2.0, "time/sync": 1.0},  # no reward: counted as 0
               {"step": 2, "reward/mean": 0.3}]  # no time keys: not a step of the figure
    steps, shares = time_shares(records)
    assert steps == [0.0, 1.0]
    assert shares["time/rollout"] == [0.3, 0.25] and shares["time/train"] == [0.6, 0.5]
    assert shares["time/reward"] == [0.05, 0.0] and shares["time/sync"] == [0.05, 0.25]
    assert all(abs(sum(col) - 1) < 1e-12 for col in zip(*shares.values()))


def test_an_asynchronous_run_gets_its_staleness_and_idle_figures(tmp_path):
    """Rows with `async/*` keys (rollout.max_staleness >= 1) add staleness.png and idle.png; the lines are the
    run's values (read back from the figure's own data: a plot of the wrong key would differ)."""
    import matplotlib

    matplotlib.use("Agg")
    src = write_metrics(tmp_path / "metrics.jsonl", steps=6, bad_line_at=None)
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    for r in rows:
        r.update({"rollout/staleness_max": float(min(r["step"], 2)), "rollout/staleness_mean": 0.5 * min(r["step"], 2),
                  "async/engine_idle_frac": 0.1 * r["step"], "async/trainer_idle_frac": 0.05})
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    paths = {p.name: p for p in plot_metrics(src, tmp_path / "plots")}
    assert set(paths) == set(FIGURES) | {"staleness.png", "idle.png"}
    for name in ("staleness.png", "idle.png"):
        check_png(paths[name])
    from slime_ext.tools.plots import async_figures

    keys = {f.file: f.keys for f in async_figures()}
    assert keys == {"staleness.png": ("rollout/staleness_max", "rollout/staleness_mean"),
                    "idle.png": ("async/engine_idle_frac", "async/trainer_idle_frac")}
    on_policy = plot_metrics(write_metrics(tmp_path / "on.jsonl", steps=6, bad_line_at=None), tmp_path / "on")
    assert not {"staleness.png", "idle.png"} & {p.name for p in on_policy}
