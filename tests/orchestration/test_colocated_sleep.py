"""Colocated sleep in the real loop (`TrainingJob._rl_loop`): the trainer offloads before each rollout, the
engines release their memory after it and the trainer comes back before training; the engines resume their
weights before the sync and their KV cache after it. With engines on their own devices, or rollouts beside
training (off-policy), nobody sleeps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.orchestration.test_async_rollouts import ROWS, Tokenizer, config
from tests.orchestration.test_one_method import CountingMethod, PlainEngine, SpecGroup, job_with


class SleepingEngine(PlainEngine):
    def __init__(self, log: list[str]):
        self.log = log

    def generate(self, requests: list) -> list:
        self.log.append("rollout")
        return super().generate(requests)

    def sleep(self) -> dict:
        self.log.append("engine release")
        return {"engine/released_bytes": 1000.0}

    def wake_weights(self) -> None:
        self.log.append("engine resume weights")

    def wake_kv_cache(self) -> None:
        self.log.append("engine resume kv")

    def sync_weights(self, source: Any, version: int) -> dict:
        self.log.append(f"sync {version}")
        return {}


class SleepingGroup(SpecGroup):
    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log

    def call(self, method: str, *args: Any) -> list:
        if method in ("offload", "onload"):
            self.log.append(f"trainer {method}")
            return [64, 64]  # two ranks' bytes
        return super().call(method, *args)

    def first(self, method: str, *args: Any) -> Any:
        if method == "train_step":
            self.log.append("train")
        return super().first(method, *args)


@pytest.mark.parametrize("overrides,sleeps", [
    (["rollout.engine=sglang", "cluster.colocate=true"], True),
    (["rollout.engine=sglang", "cluster.colocate=false"], False),
    (["rollout.engine=sglang", "cluster.colocate=true", "cluster.colocate_sleep=false"], False),
    (["rollout.engine=embedded", "cluster.colocate=true"], False),
])
def test_the_step_sleeps_and_wakes_both_sides_in_order(tmp_path, overrides, sleeps):
    cfg = config("train.steps=2", *overrides)
    log: list[str] = []
    engine, group = SleepingEngine(log), SleepingGroup(log)
    job = job_with(cfg, tmp_path, CountingMethod(cfg))
    manager = RolloutManager(cfg, ROWS, Tokenizer(), engine, method=job._method)
    job._method = None
    job._rl_loop(0, manager, group, engine, tmp_path / "checkpoints")
    one_step = ["trainer offload", "rollout", "engine release", "trainer onload", "train", "engine resume weights",
                "sync {v}", "engine resume kv"]
    if not sleeps:
        one_step = [e for e in one_step if not e.startswith(("trainer o", "engine"))]
    steps = [e.format(v=v) for v in (1, 2) for e in one_step]
    assert log == steps
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert ("engine/released_bytes" in first) == sleeps
    if sleeps:
        assert first["engine/released_bytes"] == 1000.0 and first["memory/trainer_offloaded_bytes"] == 128.0
