"""Resume and failure handling of the RL loop, with fake trainer / manager / engine (no Ray actors):
metrics are cut to the resumed step (also without a checkpoint), dead actors and Ray's memory monitor
become the stop-and-resume message, a half-written checkpoint is never the intact one, a finished run is
not re-run, and the peak RSS is never a made-up 0.0."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import ray.exceptions

from slime_ext.orchestration import training_job
from slime_ext.orchestration.run_dir import (RunStopped, finished_run_message, peak_rss_from_metrics,
                                             truncate_metrics)
from slime_ext.orchestration.training_job import TrainingJob, stop_on_actor_failure


class FakeSample:
    total_len = 10


class FakeManager:
    train_kind = "rl"

    def __init__(self) -> None:
        self.loaded: Optional[dict] = None

    def rollout(self, step: int) -> tuple[list, dict]:
        return [[FakeSample()]], {"reward/mean": 0.5, "response_len/mean": 3.0}

    def update(self, train: dict, step: int) -> dict:
        return {}

    def loss_spec(self) -> Any:
        return None  # the trainer's setup-time spec

    def evaluate_after_step(self, row: dict, run_dir: Path) -> None:
        pass

    def state_dict(self) -> dict:
        return {"manager_state": 1}

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state


class FakeGroup:
    """The trainer's rank actors: checkpoints in megatron_glue's layout (rank files, then the marker);
    `fail` maps (method, trainer step) to the exception that call raises."""

    def __init__(self, fail: Optional[dict[tuple[str, int], BaseException]] = None, step: int = 0):
        self.fail = fail or {}
        self.step = step

    def _maybe_fail(self, method: str) -> None:
        exc = self.fail.get((method, self.step))
        if exc is not None:
            raise exc

    def first(self, method: str, *args: Any) -> Any:
        if method == "load":
            directory = Path(args[0])
            self.step = int((directory / "latest").read_text().strip().split("_")[1])
            return {"step": self.step, "manager": {"manager_state": self.step}}
        self._maybe_fail(method)
        self.step += 1  # train_step
        return {"pg_loss": 0.1}

    def call(self, method: str, directory: str, extra: dict) -> list:
        assert method == "save"
        it_dir = Path(directory) / f"iter_{self.step:07d}"
        it_dir.mkdir(parents=True, exist_ok=True)
        (it_dir / "rank_00000.pt").write_text(json.dumps(extra))
        self._maybe_fail(method)  # dies after rank 0's file, before the marker: a half-written checkpoint
        (Path(directory) / "latest").write_text(it_dir.name + "\n")
        return [str(it_dir)]

    def push_weights(self, target: Any, version: Any = None, expect_version: Any = None) -> list:
        self._maybe_fail("push_weights")
        return []


class FakeEngine:
    """The loop's engine interface: weights go out after every step under the next step's version."""

    def __init__(self) -> None:
        self.versions: list[int] = []

    def sync_weights(self, source: Any, version: int) -> dict:
        source.push_weights("the engine's target", str(version))  # the ranks push; the driver only asks
        self.versions.append(int(version))
        return {}


def fake_job(run_dir: Path, steps: int) -> TrainingJob:
    job = TrainingJob.__new__(TrainingJob)  # the loop's collaborators only; no model, tokenizer or Ray
    from slime_ext.config.schema import Config

    job.cfg = Config(train={"steps": steps}, run={"save_every": 1})
    job.run_dir = run_dir
    job.method_name = "grpo"  # the method itself is the manager's during RL
    job.kl_active = False
    job.peak_gib = None
    return job


def steps_of(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def fixed_rss(monkeypatch):
    monkeypatch.setattr(training_job, "_peak_rss_gib", lambda: 1.5)


def test_truncate_metrics_keeps_earlier_steps_and_drops_a_cut_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
    truncate_metrics(path, 0)
    assert path.read_text() == ""
    truncate_metrics(tmp_path / "absent.jsonl", 3)  # nothing to cut
    assert not (tmp_path / "absent.jsonl").exists()


def test_kill_before_the_first_checkpoint_restarts_at_0_without_duplicate_steps(tmp_path):
    """The issue's case: step 0's row was written, then the run died before the first checkpoint marker.
    The old loop resumed at 0 without cutting metrics.jsonl and produced steps [0, 0, 1, 2]."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "memory/peak_rss_gib": 9.0}) + "\n")
    job, group, manager = fake_job(tmp_path, steps=3), FakeGroup(), FakeManager()
    start = job._resume(group, manager, FakeEngine(), tmp_path / "checkpoints")
    assert start == 0 and (tmp_path / "metrics.jsonl").read_text() == ""
    assert job.peak_gib is None  # the dropped row's measurement is not kept
    job._rl_loop(start, manager, group, FakeEngine(), tmp_path / "checkpoints")
    assert steps_of(tmp_path) == [0, 1, 2]


def test_resume_from_a_checkpoint_continues_the_metrics_and_the_peak(tmp_path):
    ckpt = tmp_path / "checkpoints"
    first = fake_job(tmp_path, steps=4)
    first._rl_loop(0, FakeManager(), FakeGroup(), FakeEngine(), ckpt)
    assert (ckpt / "latest").read_text().strip() == "iter_0000004"
    # as if killed after step 3's row, with checkpoint 2 the last marked one: rows 2 and 3 are redone
    (ckpt / "latest").write_text("iter_0000002\n")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row, peak in zip(rows, (1.0, 2.5, 3.0, 0.5)):
        row["memory/peak_rss_gib"] = peak
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job, manager, engine = fake_job(tmp_path, steps=5), FakeManager(), FakeEngine()
    start = job._resume(FakeGroup(), manager, engine, ckpt)
    assert start == 2 and manager.loaded == {"manager_state": 2}
    assert steps_of(tmp_path) == [0, 1] and job.peak_gib == 2.5  # the kept rows' peak, not 0 and not 3.0
    job._rl_loop(start, manager, FakeGroup(step=2), engine, ckpt)
    assert steps_of(tmp_path) == [0, 1, 2, 3, 4]
    # the restored weights go out as version 2 (step 2 rolls out with them), each step's update as the next
    assert engine.versions == [2, 3, 4, 5]
    assert [json.loads(line)["memory/peak_rss_gib"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][2:] \
        == [2.5, 2.5, 2.5]


def test_trainer_dying_while_saving_stops_with_the_intact_checkpoint_and_the_resume_command(tmp_path):
    ckpt = tmp_path / "checkpoints"
    group = FakeGroup(fail={("save", 2): ray.exceptions.ActorDiedError()})
    with pytest.raises(RunStopped) as info:
        fake_job(tmp_path, steps=5)._rl_loop(0, FakeManager(), group, FakeEngine(), ckpt)
    msg = str(info.value)
    assert "a Ray actor died during the checkpoint save after step 1 (ActorDiedError: The actor died" in msg
    assert (ckpt / "iter_0000002" / "rank_00000.pt").exists()  # half-written: rank 0's file, no marker
    assert f"the last intact checkpoint is {ckpt / 'iter_0000001'} " in msg and "iter_0000002" not in msg
    assert msg.endswith(f"Resume with: bash scripts/run.sh resume={tmp_path}")
    # the resume goes back to the intact checkpoint: step 1 is redone, no step twice
    job, manager = fake_job(tmp_path, steps=3), FakeManager()
    start = job._resume(FakeGroup(), manager, FakeEngine(), ckpt)
    assert start == 1 and steps_of(tmp_path) == [0]
    job._rl_loop(start, manager, FakeGroup(step=1), FakeEngine(), ckpt)
    assert steps_of(tmp_path) == [0, 1, 2]


def test_memory_monitor_kill_mid_step_stops_with_the_resume_command(tmp_path):
    oom = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.\n"
                                          "Memory on the node (IP: 10.0.0.1) where the task was running was 120GB")
    group = FakeGroup(fail={("train_step", 1): oom})
    with pytest.raises(RunStopped) as info:
        fake_job(tmp_path, steps=5)._rl_loop(0, FakeManager(), group, FakeEngine(), tmp_path / "checkpoints")
    msg = str(info.value)
    assert msg.startswith("a Ray actor died during step 1 (OutOfMemoryError: Task was killed due to the node "
                          "running low on memory.)")
    assert "Memory on the node" not in msg  # the first line only, not Ray's memory table
    assert "the machine ran low on memory" in msg and f"resume={tmp_path}" in msg
    assert str(tmp_path / "checkpoints" / "iter_0000001") in msg and steps_of(tmp_path) == [0]


@pytest.mark.parametrize("exc, described", [
    (ray.exceptions.WorkerCrashedError(), "(WorkerCrashedError: The worker died unexpectedly while executing this task."),
    # the manager actor passing on its dead engine: the cause and where it surfaced, not Ray's colored header
    (ray.exceptions.RayTaskError("rollout", "\x1b[36mray::RolloutManager.rollout()\x1b[39m (pid=1)",
                                 ray.exceptions.ActorDiedError()).as_instanceof_cause(),
     "(ActorDiedError in RolloutManager.rollout: The actor died unexpectedly before finishing this task.)"),
])
def test_other_dead_worker_errors_stop_the_same_way(tmp_path, exc, described):
    with pytest.raises(RunStopped) as info:
        with stop_on_actor_failure("step 0", tmp_path, tmp_path / "checkpoints"):
            raise exc
    assert f"a Ray actor died during step 0 {described}" in str(info.value)
    assert "no checkpoint was completed yet, so the run restarts from its first step" in str(info.value)


@pytest.mark.parametrize("raised", ["direct", "through the manager actor"])
def test_engine_failures_stop_with_the_checkpoint_the_engine_logs_and_the_resume_command(tmp_path, raised):
    """A weight sync that did not reach every engine (in the driver) or restarts used up (in the rollout
    manager actor, so wrapped by Ray): RunStopped, never training on with stale rollouts."""
    from slime_ext.engine.failures import EngineUnavailable, WeightSyncError

    exc: BaseException = WeightSyncError("update_weights_from_disk (version 4) failed: engine 1: HTTP 400")
    if raised != "direct":
        exc = ray.exceptions.RayTaskError("rollout", "ray::RolloutManager.rollout() (pid=1)",
                                          EngineUnavailable("engine 0 restarts used up")).as_instanceof_cause()
    with pytest.raises(RunStopped) as info:
        with stop_on_actor_failure("step 3", tmp_path, tmp_path / "checkpoints"):
            raise exc
    msg = str(info.value)
    name = "WeightSyncError: update_weights_from_disk (version 4)" if raised == "direct" else "EngineUnavailable: engine 0"
    assert msg.startswith(f"the rollout engines failed during step 3 ({name}")
    assert f"Engine logs: {tmp_path / 'engine_logs'}" in msg and msg.endswith(f"resume={tmp_path}")


def test_a_bug_in_the_trainer_keeps_its_traceback(tmp_path):
    group = FakeGroup(fail={("train_step", 0): ValueError("shape mismatch")})
    with pytest.raises(ValueError, match="shape mismatch"):
        fake_job(tmp_path, steps=2)._rl_loop(0, FakeManager(), group, FakeEngine(), tmp_path / "checkpoints")


def test_driver_prints_the_stop_message_without_a_traceback_and_exits_1(tmp_path, monkeypatch, caplog):
    from slime_ext.orchestration import driver
    from tests.conftest import CONFIGS

    def die(self):
        with stop_on_actor_failure("step 3", self.run_dir, self.run_dir / "checkpoints"):
            raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(driver.Job, "stage_data", die)
    with caplog.at_level(logging.ERROR, logger="slime_ext"):
        rc = driver.main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}",
                          f"run.cache_dir={tmp_path / 'cache'}", "run.stages=[data]"])
    assert rc == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().startswith("run stopped: a Ray actor died during step 3 (ActorDiedError")
    assert record.getMessage().endswith(f"Resume with: bash scripts/run.sh resume={run_dir}")
    assert record.exc_info is None


def test_resuming_a_finished_run_changes_nothing(tmp_path, monkeypatch, caplog):
    from slime_ext.orchestration import driver
    from tests.conftest import CONFIGS

    rc = driver.main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}",
                      f"run.cache_dir={tmp_path / 'cache'}", "data.synthetic.n_train=100", "data.synthetic.n_eval=10",
                      "run.stages=[data]"])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    before = (run_dir / "summary.json").read_bytes()
    assert json.loads(before)["complete"] is True

    def must_not_run(self):
        raise AssertionError("a stage ran again on a finished run")

    monkeypatch.setattr(driver.Job, "stage_data", must_not_run)
    with caplog.at_level(logging.WARNING, logger="slime_ext"):
        assert driver.main([f"resume={run_dir}"]) == 0
    assert (run_dir / "summary.json").read_bytes() == before
    assert any(r.getMessage().startswith(f"run already finished: {run_dir}") and "eval_checkpoint" in r.getMessage()
               for r in caplog.records)


def test_finished_run_message_only_for_a_complete_summary(tmp_path):
    assert finished_run_message(tmp_path) is None  # no summary
    (tmp_path / "summary.json").write_text(json.dumps({"stages": {"data": {}}}))
    assert finished_run_message(tmp_path) is None  # stopped part-way: resume it
    (tmp_path / "summary.json").write_text("{broken")
    assert finished_run_message(tmp_path) is None
    (tmp_path / "summary.json").write_text(json.dumps({"stages": {}, "complete": True}))
    assert "run already finished" in finished_run_message(tmp_path)


def test_peak_rss_is_never_a_made_up_zero(tmp_path):
    from slime_ext.orchestration.driver import Job

    path = tmp_path / "metrics.jsonl"
    assert peak_rss_from_metrics(path) is None
    path.write_text('{"step": 0, "memory/peak_rss_gib": 3.25}\n{"step": 1, "memory/peak_rss_gib": 0.0}\n{"step": 2}\n')
    assert peak_rss_from_metrics(path) == 3.25
    # a resumed finished RL stage that ran no step reports the kept measurement or None, not 0.0
    job = Job.__new__(Job)
    job.cfg, job.run_dir, job.warm_dir = SimpleNamespace(run=SimpleNamespace(stages=["rl"])), tmp_path, tmp_path
    job._job = SimpleNamespace(run_rl=lambda warm_dir, with_eval: {}, peak_gib=None)
    assert job.stage_rl()["peak_rss_gib"] is None
    job._job.peak_gib = 3.254
    assert job.stage_rl()["peak_rss_gib"] == 3.25


def test_eval_warm_start_false_skips_the_warm_start_evaluation_and_true_runs_it_once(tmp_path, monkeypatch):
    """`eval.warm_start: false`: no evaluation before step 0, none read back on resume; the default evaluates the
    warm start when the run starts and reads its report back when it resumes."""
    from slime_ext import evaluation
    from slime_ext.config.schema import Config

    monkeypatch.setattr(evaluation, "load_report", lambda path: json.loads(Path(path).read_text()))
    calls: list[str] = []
    for warm_start in (True, False):
        job = fake_job(tmp_path / str(warm_start), steps=1)
        job.run_dir.mkdir()
        job.cfg = Config(train={"steps": 1}, eval={"warm_start": warm_start})
        job.evaluate = lambda engine, label: calls.append(label) or {"mean@4": 0.25}
        fresh = job._warm_start_report(FakeEngine(), with_eval=True, resuming=False)
        assert fresh == ({"warm start (SFT)": {"mean@4": 0.25}} if warm_start else {})
        (job.run_dir / "eval_warm_start.json").write_text(json.dumps({"mean@4": 0.25}))
        resumed = job._warm_start_report(FakeEngine(), with_eval=True, resuming=True)
        assert bool(resumed) is warm_start
        assert job._warm_start_report(FakeEngine(), with_eval=False, resuming=False) == {}  # no eval stage
    assert calls == ["warm_start"]
