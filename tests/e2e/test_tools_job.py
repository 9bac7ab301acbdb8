"""configs/grpo_tools.yaml through the whole job, tiny: a warm start on the tool-call reference solutions (the
calculator's answers masked out), GRPO steps whose rollouts are episodes of the tools environment, and the
held-out evaluation run as episodes. The warm start is short but learns the call format, so the rollouts call
the calculator; the step-0 consistency check (every trained token's trainer logprob against the engine's)
fails if an observation token were trained or misplaced."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS

TINY = [
    "data.synthetic.n_train=600", "data.synthetic.n_eval=8", "tokenizer.n_training_texts=600",
    "model.hidden_size=64", "model.num_layers=2", "model.moe_intermediate_size=64", "model.intermediate_size=128",
    "sft.steps=100", "sft.batch_size=16", "sft.lr=6e-3", "sft.warmup_steps=10",
    "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=4", "train.micro_batch_size=16", "train.steps=2",
    "eval.n_prompts=8", "eval.n_samples=1", "eval.k=[1]", "eval.greedy=false",
    "run.stages=[data,tokenizer,check_references,sft,rl,eval]",
]


def run_tools_job(tmp_path, *extra: str) -> tuple[list[dict], dict]:
    from slime_ext.orchestration.driver import main

    assert main([str(CONFIGS / "grpo_tools.yaml"), f"run.output_dir={tmp_path / 'runs'}",
                 f"run.cache_dir={tmp_path / 'cache'}", *TINY, *extra]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((run_dir / "eval_final.json").read_text())


def check_tool_path(rows: list[dict], final: dict) -> None:
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["consistency/abs_diff_mean"] < 1e-3
    for r in rows:  # 100 SFT steps at lr 6e-3: 81-94% of the episodes call the calculator (seed 0; 88-100% at 1)
        assert r["env/tool_call_share"] > 0.25, r["env/tool_call_share"]
        assert r["env/turns_mean"] > 1 and r["env/observation_tokens_mean"] > 0
        assert r["env/cached_token_share_later_turns"] > 0.5  # later turns continue from the prefix cache
        assert r["rollout/generated_tokens"] == pytest.approx(r["env/generated_tokens_mean"] * 16)
    metrics = final["meta"]["response_metrics"]  # the held-out evaluation ran episodes too
    assert metrics["called_tool"] > 0.25 and metrics["turns"] > 1


# 50 s on a 2-core CI machine (100 SFT steps to learn the call format): a slow check. The default run keeps the
# multi-turn job through the stack (tests/envs/test_training_job.py) and the calculator environment's own tests
# (tests/envs/test_tools.py, tests/envs/test_server_path.py).
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tools_job_calls_the_calculator_on_the_embedded_engine(tmp_path):
    rows, final = run_tools_job(tmp_path, "rollout.manager=driver")
    check_tool_path(rows, final)


@pytest.mark.slow  # 52 s here (47 s embedded): the multi-turn server path has fast tests (tests/envs/test_server_path.py)
@pytest.mark.timeout(900)
def test_the_tools_job_calls_the_calculator_through_an_engine_server(tmp_path):
    rows, final = run_tools_job(tmp_path, "rollout.engine=sglang")
    check_tool_path(rows, final)
    assert all(r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == r["step"] for r in rows)
