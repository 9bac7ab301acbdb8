"""One placement model: what the dry-run plan prints is what the training job asks Ray for.

The train group is built against a recording stand-in for `ray` (nothing starts), for the default CPU
config and the Qwen3-30B-A3B cluster config, and its placement group and per-rank requests are compared
with the plan's."""

from __future__ import annotations

import types

import pytest

from slime_ext.config import load_config
from slime_ext.orchestration import train_group as train_group_module
from slime_ext.orchestration.placement import actor_groups, build_placement, trainer_world
from slime_ext.orchestration.plan import build_plan
from tests.conftest import CONFIGS
from tests.orchestration.test_plan import reference_config


class RecordingRay:
    """Records placement groups and actor options the way TrainGroup calls them."""

    def __init__(self):
        self.groups, self.actors, self.events = [], [], []
        recorder = self

        class _PG:
            def __init__(self, bundles, strategy):
                self.bundles, self.strategy = bundles, strategy

            def ready(self):
                return None

        class _Actor:
            def __init__(self, cls):
                self.cls = cls

            def options(self, **opts):
                recorder.actors.append(opts)

                def remote(rank, world, addr, threads):  # a rank actor: rank 0 reports its store's address and port
                    recorder.events.append(("start", rank, addr))

                    def rendezvous():
                        recorder.events.append(("rendezvous", rank))
                        return "10.0.0.7", 29517  # rank 0's node address, as Ray reports it there
                    return types.SimpleNamespace(rendezvous=types.SimpleNamespace(remote=rendezvous),
                                                 join=types.SimpleNamespace(
                                                     remote=lambda a, p: recorder.events.append(("join", rank, a, p))))
                return types.SimpleNamespace(remote=remote)

        def placement_group(bundles, strategy):
            pg = _PG(bundles, strategy)
            recorder.groups.append(pg)
            return pg

        def strategy(placement_group, placement_group_bundle_index):
            return ("bundle", placement_group_bundle_index)

        self.util = types.SimpleNamespace(
            placement_group=placement_group,
            scheduling_strategies=types.SimpleNamespace(PlacementGroupSchedulingStrategy=strategy))
        self.remote = _Actor
        self.get = lambda x: x


def _configs(tmp_path):
    return {"default": load_config(CONFIGS / "grpo.yaml").config, "qwen3-30b-a3b": reference_config(tmp_path)}


@pytest.mark.parametrize("name", ["default", "qwen3-30b-a3b"])
def test_the_train_group_builds_what_the_plan_prints(tmp_path, monkeypatch, name):
    cfg = _configs(tmp_path)[name]
    plan = build_plan(cfg)
    fake = RecordingRay()
    monkeypatch.setattr(train_group_module, "ray", fake)
    groups = actor_groups(cfg)
    train_group_module.TrainGroup(groups["train"], build_placement(cfg), threads=1)

    (pg,) = fake.groups
    assert pg.bundles == [plan.placement.bundle] * plan.placement.num_bundles and pg.strategy == plan.placement.strategy
    (train_plan,) = [a for a in plan.actors if a.name == "train_actor"]
    assert len(fake.actors) == train_plan.count == plan.layout.world == trainer_world(cfg)
    for rank, opts in enumerate(fake.actors):
        assert opts["num_cpus"] == train_plan.resources.get("CPU", 0)
        assert opts["num_gpus"] == train_plan.resources.get("GPU", 0)
        assert opts["scheduling_strategy"] == ("bundle", train_plan.bundles[rank][0])
    # every rank is started before the driver waits on anything (their imports overlap); rank 0 hosts the
    # rendezvous at its own node's address (None: never a 127.0.0.1 the driver assumed) on a port the OS gave
    # it, and every rank joins at that address and port
    n = len(fake.actors)
    assert fake.events == ([("start", r, None) for r in range(n)] + [("rendezvous", 0)]
                           + [("join", r, "10.0.0.7", 29517) for r in range(n)])
    # the job's own copy of the actor groups is the plan's, the engine and the rollout manager included
    assert list(groups.values()) == plan.actors


def test_a_train_group_started_without_waiting_joins_its_ranks_once_when_asked(tmp_path, monkeypatch):
    """`wait=False` (the RL stage: the engines and the rollout manager start beside the ranks) returns with the
    ranks started and nothing waited for; `wait_started` joins them on rank 0's port, once."""
    cfg = _configs(tmp_path)["default"]
    fake = RecordingRay()
    monkeypatch.setattr(train_group_module, "ray", fake)
    group = train_group_module.TrainGroup(actor_groups(cfg)["train"], build_placement(cfg), threads=1, wait=False)
    n = len(fake.actors)
    assert n == 2 and fake.events == [("start", r, None) for r in range(n)]
    group.wait_started()
    group.wait_started()
    assert fake.events[n:] == [("rendezvous", 0)] + [("join", r, "10.0.0.7", 29517) for r in range(n)]


def test_the_run_engine_waits_for_its_engine_once_and_only_when_asked():
    """start_engine returns while the engines start; `engine` waits for them the first time it is read."""
    from slime_ext.orchestration.run_engine import RunEngine

    calls = []
    run = RunEngine(lambda: calls.append("ready") or "the pool", lambda: calls.append("shutdown"))
    assert calls == []
    assert run.engine == "the pool" and run.engine == "the pool" and calls == ["ready"]
    run.shutdown()
    assert calls == ["ready", "shutdown"]


def test_reference_cluster_numbers(tmp_path):
    """8 GPUs on one node x num_nodes, colocated: one bundle per GPU, trainer ranks share them with engines."""
    cfg = _configs(tmp_path)["qwen3-30b-a3b"]
    plan = build_plan(cfg)
    total = cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
    assert plan.placement.num_bundles == total and plan.placement.bundle == {"GPU": 1, "CPU": 1}
    train = actor_groups(cfg)["train"]
    assert train.resources["GPU"] == pytest.approx(0.4) and train.count == total


def test_manager_placement_follows_the_config():
    driver = actor_groups(load_config(CONFIGS / "grpo.yaml", ["rollout.manager=driver"]).config)["manager"]
    actor = actor_groups(load_config(CONFIGS / "grpo.yaml").config)["manager"]
    assert driver.resources == {} and "driver" in driver.node
    assert actor.resources == {"CPU": 0.01} and "Ray actor" in actor.node
