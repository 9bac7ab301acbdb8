"""Multi-turn episodes through the whole job: SFT, then RL steps whose rollouts are episodes of the scripted
environment (observations appended as tokens, loss mask 0), trained by the Megatron trainer. The step-0
consistency check compares the trainer's logprobs of every trained token, recomputed over prompt + response,
with the engine's: a response whose tokens were not the sampled ones, or sat at other positions, fails it."""

from __future__ import annotations

import json

import pytest

from slime_ext.envs import registry
from tests.doc_examples import tiny_job
from tests.conftest import CONFIGS

TINY = tiny_job(n_samples=4, max_response_len=64)


@pytest.mark.timeout(900)
def test_a_multi_turn_job_trains_with_observation_masks(tmp_path, monkeypatch, job_cache):
    from slime_ext.orchestration.driver import main

    monkeypatch.setitem(registry.ENVS, "scripted", registry.EnvEntry("tests.envs.conftest:ScriptedEnv"))
    rc = main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={job_cache}",
               "rollout.manager=driver", "rollout.env=scripted", "rollout.max_turns=3", "rollout.max_turn_tokens=12",
               "train.routing_replay=true", "train.check_consistency_at_start=true", *TINY])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["consistency/abs_diff_mean"] < 1e-3
    for r in rows:
        assert r["env/turns_mean"] > 1.5 and r["env/observation_tokens_mean"] > 5
        assert r["env/cached_token_share_later_turns"] > 0.5
        assert r["rollout/generated_tokens"] == pytest.approx(r["env/generated_tokens_mean"] * 16)
