"""The rollout manager with `rollout.env` set: samples whose masks, logprobs, routing and response text are
the episode's; with an environment that ends every episode after one turn, exactly the single-turn path's
samples; and multi-turn episodes in one-step off-policy runs with partial rollouts (a turn aborted by a weight
sync is continued, every token keeps its version)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from slime_ext.config import load_config
from slime_ext.data import SampleStatus
from slime_ext.envs import registry
from slime_ext.envs.base import EnvStep, Environment
from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.conftest import CONFIGS
from tests.envs.conftest import RecordingEngine, ScriptedEnv, embedded_engine
from tests.envs.test_token_exact import check_token_exact

ROWS = [{"prompt": f"what is {i} + 34?", "label": str(i + 34), "row_id": i, "level": "L0"} for i in range(6)]


class OneTurnEnv(ScriptedEnv):
    def __init__(self, settings=None, tokenizer=None):
        super().__init__(settings, tokenizer, done_after=1)


@pytest.fixture(autouse=True)
def test_envs(monkeypatch):
    monkeypatch.setitem(registry.ENVS, "scripted", registry.EnvEntry("tests.envs.conftest:ScriptedEnv"))
    monkeypatch.setitem(registry.ENVS, "one_turn", registry.EnvEntry("tests.envs.test_rollout_manager:OneTurnEnv"))


def config(*overrides: str):
    base = ["rollout.manager=driver", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
            "rollout.max_response_len=48"]
    return load_config(CONFIGS / "grpo.yaml", base + list(overrides)).config


def turns_of(sample) -> SimpleNamespace:
    return SimpleNamespace(turns=[SimpleNamespace(**t) for t in sample.metadata["env"]["turn_records"]])


def test_samples_of_multi_turn_episodes(model_dir, tokenizer):
    cfg = config("rollout.env=scripted", "rollout.max_turns=3", "rollout.max_turn_tokens=10",
                 "train.routing_replay=true")
    engine = RecordingEngine(embedded_engine(model_dir))
    manager = RolloutManager(cfg, ROWS, tokenizer, engine)
    groups, metrics = manager.rollout(0)
    calls = engine.by_rid()
    samples = [s for g in groups for s in g]
    assert len(samples) == 4 and len(engine.calls) == max(len(turns_of(s).turns) for s in samples)
    for s in samples:
        episode = turns_of(s)
        check_token_exact(s.prompt_ids, s.response_ids, s.loss_mask, s.logprobs, episode, calls, tokenizer,
                          ScriptedEnv.OBSERVATIONS)
        assert s.routed_experts is not None and s.routed_experts.shape[0] == s.total_len - 1
        last = episode.turns[-1]
        assert s.response_text == tokenizer.decode(calls[last.rid][1].output_ids, skip_special_tokens=True)
        assert s.metadata["env"]["turns"] == len(episode.turns) and s.advantage is not None
        expected = SampleStatus.COMPLETED if last.finish_reason == "stop" and s.metadata["env"]["finish"] == "done" \
            else SampleStatus.TRUNCATED
        assert s.status == expected
        assert 0.0 in s.loss_mask or len(episode.turns) == 1
    assert metrics["env/turns_mean"] > 1.5 and metrics["env/cached_token_share_later_turns"] > 0.5
    assert metrics["rollout/generated_tokens"] == sum(int(sum(s.loss_mask)) for s in samples)
    assert metrics["env/tool_calls_mean"] == pytest.approx(sum(s.metadata["env"]["tool_calls"] for s in samples) / 4)


def test_an_environment_that_ends_after_one_turn_gives_the_single_turn_samples(model_dir, tokenizer):
    single = RolloutManager(config(), ROWS, tokenizer, embedded_engine(model_dir)).rollout(0)[0]
    multi, metrics = RolloutManager(config("rollout.env=one_turn"), ROWS, tokenizer, embedded_engine(model_dir)).rollout(0)
    for a, b in zip((s for g in single for s in g), (s for g in multi for s in g)):
        assert (a.sample_id, a.prompt_ids, a.response_ids, a.logprobs, a.loss_mask, a.status, a.response_text,
                a.reward, a.advantage) == (b.sample_id, b.prompt_ids, b.response_ids, b.logprobs, b.loss_mask, b.status,
                                           b.response_text, b.reward, b.advantage)
        assert "env" not in a.metadata and b.metadata["env"]["turns"] == 1
    assert metrics["env/turns_mean"] == 1.0


def test_methods_whose_plans_carry_samplers_are_refused(model_dir, tokenizer):
    from slime_ext.methods.base import PromptPlan
    from slime_ext.methods.grpo.method import GRPO

    class WithSampler(GRPO):
        def plan(self, prompts, step):
            return [PromptPlan(p.n, p.sampling, [{"kind": "some_sampler"}]) for p in super().plan(prompts, step)]

    cfg = config("rollout.env=scripted")
    engine = RecordingEngine(embedded_engine(model_dir))
    manager = RolloutManager(cfg, ROWS, tokenizer, engine, method=WithSampler(cfg, tokenizer))
    with pytest.raises(ValueError, match="rollout.env = 'scripted' but requests .* carry per-request samplers"):
        manager.rollout(0)
    assert engine.calls == []


class FakeTokenizer:
    """Prompts `... q<i> ...` -> [3, 100 + i]; any other text (an observation) -> two ids from its length."""

    eos_token_id = 1
    pad_token_id = 1

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        import re

        m = re.search(r"q(\d+)", text)
        return {"input_ids": [3, 100 + int(m.group(1))] if m else [200 + len(text) % 7, 201]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


class TwoTurnEnv(Environment):
    def step(self, episode, turn):
        return EnvStep(done=turn.index >= 1, observation="obs")


def test_partial_rollouts_continue_an_aborted_turn_and_keep_every_tokens_version(monkeypatch):
    from tests.orchestration.test_async_rollouts import HOLD, MAX_NEW, FakeEngine

    monkeypatch.setitem(registry.ENVS, "two_turns", registry.EnvEntry("tests.envs.test_rollout_manager:TwoTurnEnv"))
    cfg = load_config(CONFIGS / "grpo.yaml", [
        "rollout.manager=driver", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
        f"rollout.max_response_len={3 * MAX_NEW}", "rollout.max_staleness=1", "rollout.partial_rollouts=true",
        "rollout.env=two_turns", f"rollout.max_turn_tokens={MAX_NEW}"]).config
    engine = FakeEngine(hold=True)
    rows = [{"prompt": f"q{i}", "label": "7", "row_id": i} for i in range(4)]
    manager = RolloutManager(cfg, rows, FakeTokenizer(), engine)
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(result=manager.rollout(1, weight_version=0)))
    worker.start()
    deadline = time.time() + 10
    while len(engine.requests) < 4 and time.time() < deadline:  # turn 0 is in flight, held after HOLD tokens
        time.sleep(0.01)
    time.sleep(0.05)
    assert manager.pause_generation() == 4
    engine.version = 1
    manager.resume_generation(1)
    worker.join(timeout=20)
    groups, metrics = out["result"]
    for s in (s for g in groups for s in g):
        turns = s.metadata["env"]["turn_records"]
        assert [t["generated"] for t in turns] == [MAX_NEW, MAX_NEW] and turns[0]["observation"] == 2
        # turn 0: HOLD tokens of version 0, then (continued after the sync) version 1; observation; turn 1: version 1
        assert s.token_versions == [0] * HOLD + [1] * (MAX_NEW - HOLD) + [1, 1] + [1] * MAX_NEW
        assert s.logprobs == [-0.1] * HOLD + [-0.2] * (MAX_NEW - HOLD) + [0.0, 0.0] + [-0.2] * MAX_NEW
        # rollout.stale_tokens mask (the default): the version-0 tokens are not trained, nor the observation
        assert s.loss_mask == [0.0] * HOLD + [1.0] * (MAX_NEW - HOLD) + [0.0, 0.0] + [1.0] * MAX_NEW
    assert metrics["rollout/partial_aborted"] == 4.0  # the staleness is measured by the loop (async_rollouts)
