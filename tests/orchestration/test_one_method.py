"""One method object per run (issue 29): `TrainingJob` hands its method to the rollout manager (the same object
in the driver process, pickled into the actor), reaches it only through the manager during RL, and gets it back
at the end; each step's loss spec comes from that method with the rollout and reaches the trainer with the batch.

Through the real loop (`TrainingJob._start_rollout_manager`, `_rl_loop`, `_rl_step`) and the real rollout manager, in
the driver and as a Ray actor (a local Ray), on- and off-policy, with a fake engine and a fake trainer that records
the loss spec it was given. What a wrong implementation fails: `evaluate_after_step` on a driver-side copy sees
no finish and no update (0 instead of the step's counts); a loss spec fixed at setup sends one clip range every
step instead of the one the method's state gave when the batch was made.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from sglang_patches.decoding import SamplingParams
from slime_ext.algo import LossSpec
from slime_ext.data.generation import GenerateResult
from slime_ext.methods.base import Method, PromptPlan
from slime_ext.orchestration import training_job
from slime_ext.orchestration.async_rollouts import QUEUE_KEY, AsyncRollouts
from slime_ext.orchestration.placement import actor_groups
from slime_ext.orchestration.rollout_manager import RemoteRolloutManager, RolloutManager
from slime_ext.orchestration.training_job import TrainingJob
from tests.orchestration.test_async_rollouts import ROWS, FakeGroup, Tokenizer, config

STEPS = 3


class CountingMethod(Method):
    """Counts its finishes and updates; its clip range widens by 0.1 with every update; `evaluate_after_step`
    appends what it sees (and the process it runs in) to `<run dir>/seen.jsonl`."""

    name = "counting"

    def __init__(self, config: Any, tokenizer: Any = None):
        super().__init__(config, tokenizer)
        self.finished = self.updates = 0

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        return [PromptPlan(2, SamplingParams(temperature=1.0, max_new_tokens=4)) for _ in prompts]

    def finish(self, groups: list[list[Any]], step: int) -> dict[str, float]:
        self.finished += 1
        for s in (s for g in groups for s in g):
            s.reward, s.advantage = 0.0, 0.0
        return {"reward/mean": 0.0, "response_len/mean": 4.0}

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        self.updates += 1
        return {}

    def loss_spec(self) -> LossSpec:
        return LossSpec(eps_clip_high=0.2 + 0.1 * self.updates)

    def state_dict(self) -> dict[str, Any]:
        return {"finished": self.finished, "updates": self.updates}

    def evaluate_after_step(self, row: dict[str, float], engine: Any, run_dir: Path) -> None:
        seen = {"step": row["step"], "finished": self.finished, "updates": self.updates, "pid": os.getpid(),
                "engine": type(engine).__name__}
        with (run_dir / "seen.jsonl").open("a") as f:
            f.write(json.dumps(seen) + "\n")


class PlainEngine:
    """Picklable (the actor manager gets a copy): each request's tokens are a function of its seed."""

    def generate(self, requests: list) -> list:
        out = []
        for q in requests:
            n = q.sampling.max_new_tokens
            out.append(GenerateResult(q.rid, [10 + (q.seed + k) % 50 for k in range(n)], [-0.1] * n, "length",
                                      [{} for _ in range(n)], 0, len(q.input_ids)))
        return out

    def sync_weights(self, source: Any, version: int) -> dict:
        return {}


class SpecGroup(FakeGroup):
    """The fake trainer, recording the loss spec each train step was given."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[LossSpec] = []

    def first(self, method: str, *args: Any) -> Any:
        if method == "train_step":
            self.specs.append(args[3])
        return super().first(method, *args)


@pytest.fixture(autouse=True)
def fixed_rss(monkeypatch):
    monkeypatch.setattr(training_job, "_peak_rss_gib", lambda: 1.0)


@pytest.fixture(scope="module")
def local_ray():
    """One small local Ray for this module's actor cases (the workers import this module from the repo root)."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def job_with(cfg: Any, run_dir: Path, method: Method) -> TrainingJob:
    job = TrainingJob.__new__(TrainingJob)  # the loop's collaborators only: no model, trainer or engine actors
    job.cfg, job.run_dir, job.kl_active, job.peak_gib = cfg, run_dir, False, None
    job.train_rows, job.tokenizer, job.actors = ROWS, Tokenizer(), actor_groups(cfg)
    job.method, job.method_name = method, method.name
    return job


@pytest.mark.parametrize("where", ["driver", "actor"])
@pytest.mark.parametrize("off_policy", [0, 1])
def test_the_manager_holds_the_one_method_and_its_loss_spec_reaches_the_trainer(tmp_path, request, where, off_policy):
    if where == "actor":
        request.getfixturevalue("local_ray")
    cfg = config(f"rollout.manager={where}", f"train.steps={STEPS}", f"rollout.max_staleness={off_policy}")
    method = CountingMethod(cfg)
    job = job_with(cfg, tmp_path, method)
    engine = PlainEngine()
    manager, actor = job._start_rollout_manager(engine)
    assert (actor is None) == (where == "driver") and (manager is None) == (where == "actor")
    if actor is not None:
        manager = RemoteRolloutManager(actor)  # waits for the actor's start
    with pytest.raises(RuntimeError, match="holds the method"):
        job.method  # noqa: B018 - the driver has no method while the manager holds it
    if off_policy:
        manager = AsyncRollouts(manager, engine, STEPS, max_staleness=1)
    group = SpecGroup()
    job._rl_loop(0, manager, group, engine, tmp_path / "checkpoints")

    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    # evaluate_after_step runs where the method lives, with the manager's engine, after the step's update
    assert all((r["pid"] == os.getpid()) == (where == "driver") and r["engine"] == "PlainEngine" for r in seen)
    assert [(r["step"], r["updates"]) for r in seen] == [(0, 1), (1, 2), (2, 3)]
    clips = [spec.eps_clip_high for spec in group.specs]
    if off_policy:  # rollout t+1 is finished (and its spec taken) during step t, before update(t)
        assert [r["finished"] for r in seen] == [2, 3, 3]
        assert clips == pytest.approx([0.2, 0.2, 0.3])
        saved = pickle.loads((tmp_path / "checkpoints" / "iter_0000002" / "rank_00000.pt").read_bytes())
        (queued,) = saved["manager"][QUEUE_KEY]["rollouts"]
        assert queued["index"] == 2 and queued["loss"]["eps_clip_high"] == pytest.approx(0.3)  # rollout 2's, kept
    else:  # each step's batch with the spec of the state that made it: after update(t - 1)
        assert [r["finished"] for r in seen] == [1, 2, 3]
        assert clips == pytest.approx([0.2, 0.3, 0.4])

    job.method = manager.release_method()  # back to the driver for the final evaluations, with its final state
    assert job.method.state_dict() == {"finished": 3, "updates": 3}
    # in the driver it is the very object the job built; the actor worked on (and returned) the one it was handed
    assert (job.method is method) == (where == "driver")
    if actor is not None:
        import ray

        ray.kill(actor)


def test_a_resumed_async_run_trains_the_queued_rollout_with_its_saved_spec(tmp_path):
    cfg = config("train.steps=4", "rollout.max_staleness=1")
    method = CountingMethod(cfg)
    engine = PlainEngine()
    loop = AsyncRollouts(RolloutManager(cfg, ROWS, Tokenizer(), engine, method=method), engine, 4, max_staleness=1)
    loop.rollout(0)
    loop.sync_weights(None, 1)  # collects rollout 1 (made with no update yet: clip 0.2)
    loop.update({}, 0)
    state = pickle.loads(pickle.dumps(loop.state_dict()))
    loop.close()
    (queued,) = state[QUEUE_KEY]["rollouts"]
    assert queued["index"] == 1 and queued["loss"]["eps_clip_high"] == pytest.approx(0.2)

    fresh = CountingMethod(cfg)
    fresh.updates = 5  # whatever the restored method would say now, the pending batch keeps its own spec
    resumed = AsyncRollouts(RolloutManager(cfg, ROWS, Tokenizer(), engine, method=fresh), engine, 4, max_staleness=1)
    resumed.load_state_dict(state)
    resumed.resume_at(1)
    groups, _ = resumed.rollout(1)
    assert resumed.loss_spec().eps_clip_high == pytest.approx(0.2) and groups[0][0].sample_id.startswith("s1-")
    resumed.close()


def test_every_method_config_builds_a_method_that_survives_the_hand_over(tmp_path):
    """The manager actor is handed the driver's method by pickling (clients with locks included: DA-GRPO's
    cloud): every config's method must make the trip with its state."""
    from ray import cloudpickle

    from slime_ext.config import load_config
    from slime_ext.orchestration.local_endpoints import build_run_method
    from slime_ext.tokenizer import train_tokenizer
    from tests.conftest import CONFIGS

    tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: Step 1: 1 + 2 = 3.\n\\boxed{3}"] * 30, vocab_size=300,
                          out_dir=tmp_path)
    configs = sorted(p for p in CONFIGS.glob("*.yaml") if p.name != "base.yaml")
    assert len(configs) >= 10
    for path in configs:
        method = build_run_method(load_config(path, []).config, tok)
        copy = cloudpickle.loads(cloudpickle.dumps(method))
        assert type(copy) is type(method) and copy.state_dict() == method.state_dict(), path.name
        assert copy.loss_spec() == method.loss_spec(), path.name


def test_the_engine_has_its_weight_source_before_the_manager_takes_it(tmp_path, monkeypatch):
    """`run_rl` attaches the trainer's ranks to the engine (a restarted engine server is brought current by them)
    before the rollout manager takes the engine: with `rollout.manager: actor` the manager works on a copy
    pickled at its start, and a copy taken before the attach could not bring a restarted server current."""
    from slime_ext.orchestration.run_engine import RunEngine

    class Engine(PlainEngine):
        source = None

        def attach_weight_source(self, source: Any) -> None:
            self.source = source

    class Stop(Exception):
        pass

    class Group(FakeGroup):
        def shutdown(self) -> None:
            pass

    cfg = config("train.steps=1")
    job = job_with(cfg, tmp_path, CountingMethod(cfg))
    engine, group = Engine(), Group()
    seen: list[Any] = []
    monkeypatch.setattr(training_job, "init_ray", lambda _cfg: None)
    monkeypatch.setattr(training_job, "start_engine", lambda *a: RunEngine(lambda: engine, lambda: None))
    monkeypatch.setattr(TrainingJob, "rl_train_group", lambda self: group)
    job.method.partner_dir = lambda warm: None

    def start_manager(self: TrainingJob, handed: Any, scorer: Any = None) -> Any:
        seen.append(handed.source)
        raise Stop

    monkeypatch.setattr(TrainingJob, "_start_rollout_manager", start_manager)
    with pytest.raises(Stop):
        job.run_rl(tmp_path / "warm", with_eval=False)
    assert seen == [group]
