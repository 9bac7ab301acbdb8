"""An engine restart is visible from the driver (issue 28, item 4): the pool restarts engines inside the
rollout manager (a Ray actor whose log the driver does not show), so each step's rollout metrics carry
`engine/restarts` and `engine/resent_requests` (0 when nothing happened), the driver prints a line per
restart and appends it to `<run dir>/engine_events.jsonl`.

Through the real loop (`TrainingJob._rl_loop`) and rollout manager with the fake engine and trainer of
test_off_policy (no Ray, no model), on- and off-policy. The real pool's report after a SIGKILL is checked in
tests/engine/test_server_pool.py, and the whole path with a killed server in tests/e2e/test_sglang_loop.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slime_ext.orchestration import training_job
from slime_ext.orchestration.rollout_manager import ENGINE_EVENTS_KEY, restart_metrics
from slime_ext.orchestration.run_dir import ENGINE_EVENTS_FILE
from tests.orchestration.test_async_rollouts import FakeEngine, FakeGroup, config, job_for, manager_for, metrics, step_of


class RestartingEngine(FakeEngine):
    """The fake engine, with a restart of engine 0 (re-sending the whole batch) during step `fault_step`'s
    rollout, reported once through `take_restart_report` as the server pool does."""

    def __init__(self, fault_step: int):
        super().__init__()
        self.fault_step = fault_step
        self._report = {"restarts": 0, "resent_requests": 0, "events": []}

    def generate(self, requests: list) -> list:
        if step_of(requests[0].rid) == self.fault_step and not self._report["events"]:
            n = len(requests)
            self._report = {"restarts": 1, "resent_requests": n, "events": [
                {"time": time.time(), "engine": 0, "url": "http://127.0.0.1:1", "restart": 1, "max_restarts": 2,
                 "reason": "its server process died", "resent_requests": n}]}
        return super().generate(requests)

    def take_restart_report(self) -> dict:
        report, self._report = self._report, {"restarts": 0, "resent_requests": 0, "events": []}
        return report


@pytest.fixture(autouse=True)
def fixed_rss(monkeypatch):
    monkeypatch.setattr(training_job, "_peak_rss_gib", lambda: 1.0)


@pytest.mark.parametrize("off_policy", [0, 1])
def test_a_restart_shows_on_the_console_in_the_metrics_and_in_the_run_dir(tmp_path, capsys, off_policy):
    cfg = config("train.steps=3", f"rollout.max_staleness={off_policy}")
    engine, group = RestartingEngine(fault_step=1), FakeGroup()
    job_for(cfg, tmp_path)._rl_loop(0, manager_for(cfg, engine), group, engine, tmp_path / "checkpoints")
    rows = metrics(tmp_path)
    assert [r["engine/restarts"] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["engine/resent_requests"] for r in rows] == [0.0, 4.0, 0.0]  # 2 prompts x 2 samples
    assert not any(k.startswith("_") for r in rows for k in r)  # the events list is not a metric
    out = capsys.readouterr().out
    assert "[step 1] engine 0 restarted (1/2): its server process died; 4 request(s) re-sent" in out
    assert out.count("restarted") == 1
    (line,) = (tmp_path / ENGINE_EVENTS_FILE).read_text().splitlines()
    event = json.loads(line)
    assert {k: event[k] for k in ("step", "engine", "restart", "max_restarts", "reason", "resent_requests")} == {
        "step": 1, "engine": 0, "restart": 1, "max_restarts": 2, "reason": "its server process died",
        "resent_requests": 4}
    assert event["time"] > 0


def test_no_restart_leaves_zeros_no_console_line_and_no_events_file(tmp_path, capsys):
    cfg = config("train.steps=2")
    engine, group = RestartingEngine(fault_step=-1), FakeGroup()
    job_for(cfg, tmp_path)._rl_loop(0, manager_for(cfg, engine), group, engine, tmp_path / "checkpoints")
    rows = metrics(tmp_path)
    assert all(r["engine/restarts"] == 0.0 and r["engine/resent_requests"] == 0.0 for r in rows)
    assert "restarted" not in capsys.readouterr().out and not (tmp_path / ENGINE_EVENTS_FILE).exists()


def test_an_engine_that_cannot_restart_reports_zeros():
    """The embedded engine (and a Ray actor handle) has no restart report: zeros, no events."""
    assert restart_metrics(FakeEngine(), 3) == {"engine/restarts": 0.0, "engine/resent_requests": 0.0}
    engine = RestartingEngine(fault_step=0)
    engine._report = {"restarts": 1, "resent_requests": 2, "events": [{"engine": 1}]}
    got = restart_metrics(engine, 5)
    assert got[ENGINE_EVENTS_KEY] == [{"engine": 1, "step": 5}] and got["engine/restarts"] == 1.0
