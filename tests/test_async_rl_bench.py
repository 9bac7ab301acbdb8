"""benchmarks/async_rl.py without running jobs: the step model's closed forms, the per-run summary of a
metrics file (on-policy and asynchronous rows), and the quick JSON's shape from a faked run per K."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import async_rl


def test_step_model_closed_forms():
    assert async_rl.step_time(3.0, 2.0, 0.5, 0) == 5.5
    assert async_rl.step_time(3.0, 2.0, 0.5, 1) == 3.5  # max(3, 2) + 0.5
    assert async_rl.step_time(3.0, 2.0, 0.5, 4) == 3.5  # no term for K > 1
    assert async_rl.step_time(3.0, 2.0, 0.5, 2, partial=True) == 3.0  # max(3, 2 + 0.5)
    assert async_rl.step_time(1.0, 2.0, 0.5, 2, partial=True) == 2.5


def write_run(run: Path, rows: list[dict]) -> Path:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_summary_of_an_on_policy_and_an_asynchronous_run(tmp_path):
    on = write_run(tmp_path / "on", [
        {"step": 0, "time/step": 4.0, "time/rollout": 1.0, "time/train": 2.5, "time/sync": 0.5, "rollout/generated_tokens": 400},
        {"step": 1, "time/step": 4.0, "time/rollout": 3.0, "time/train": 0.5, "time/sync": 0.5, "rollout/generated_tokens": 400}])
    s = async_rl.summarise_run(on)
    assert s["tokens_per_s"] == 100.0 and s["max_staleness_seen"] == 0.0
    assert s["engine_idle_frac"] == pytest.approx(0.5) and s["trainer_idle_frac"] == pytest.approx(0.5)
    assert (s["generate_s"], s["train_s"], s["sync_s"]) == (2.0, 1.5, 0.5)
    off = write_run(tmp_path / "off", [
        {"step": t, "time/step": 2.0, "time/rollout": 1.5, "time/train": 1.5, "time/sync": 0.5, "time/sync_wait": 0.2,
         "rollout/generated_tokens": 300, "rollout/staleness_max": float(min(t, 2)), "async/engine_idle_frac": 0.2,
         "async/trainer_idle_frac": 0.1 * t, "async/dropped_groups": 1.0} for t in range(3)])
    s = async_rl.summarise_run(off)
    assert s["tokens_per_s"] == 150.0 and s["max_staleness_seen"] == 2.0 and s["dropped_groups"] == 3.0
    assert s["engine_idle_frac"] == pytest.approx(0.2) and s["trainer_idle_frac"] == pytest.approx(0.1)
    assert s["sync_s"] == pytest.approx(0.3)  # the sync's own time, not its wait for the rollout


def test_quick_writes_async_quick_json_and_refuses_a_broken_bound(tmp_path, monkeypatch):
    def fake_run(k, out, cache, extra, partial):
        assert "sft.steps=40" in extra and "train.steps=4" in extra  # the quick settings reach every run
        return write_run(out / f"k{k}", [
            {"step": t, "time/step": 1.0, "time/rollout": 0.5, "time/train": 0.4, "time/sync": 0.1,
             "rollout/generated_tokens": 100 * (k + 1), **({"rollout/staleness_max": float(k),
                                                            "async/engine_idle_frac": 0.3, "async/trainer_idle_frac": 0.1}
                                                           if k else {})} for t in range(4)])

    monkeypatch.setattr(async_rl, "run_k", fake_run)
    assert async_rl.main(["--quick", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "async_quick.json").read_text())["runs"]
    assert sorted(runs) == ["0", "1", "2"]
    for k, row in runs.items():
        assert {"tokens_per_s", "max_staleness_seen", "engine_idle_frac", "trainer_idle_frac"} <= set(row)
        assert row["tokens_per_s"] == 100.0 * (int(k) + 1) and row["max_staleness_seen"] == float(k)

    def too_stale(k, out, cache, extra, partial):
        return write_run(out / f"x{k}", [{"step": 0, "time/step": 1.0, "time/rollout": 0.5, "time/train": 0.4,
                                          "rollout/generated_tokens": 10, "rollout/staleness_max": float(k + 1),
                                          "async/engine_idle_frac": 0.3, "async/trainer_idle_frac": 0.1}])

    monkeypatch.setattr(async_rl, "run_k", too_stale)
    with pytest.raises(SystemExit, match="K=0: staleness 1.0 seen, above the bound"):
        async_rl.main(["--quick", "--out", str(tmp_path / "b")])
