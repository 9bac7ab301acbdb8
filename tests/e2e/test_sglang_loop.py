"""The training loop with `rollout.engine: sglang`: engine server processes (the project's SGLang-protocol
server on CPU), driven only through SGLangEngineClient, weights synced after every step."""

from __future__ import annotations

import pytest

from tests.e2e.test_training_job import job_args, read_metrics

SERVERS = ["rollout.engine=sglang", "sglang.num_engines=2", "sft.steps=3", "train.steps=2",
           "run.stages=[data,tokenizer,sft,rl]"]


@pytest.mark.slow  # the default run covers this path through the launcher (tests/e2e/test_launcher_cpu.py)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sync", ["disk", "tensor"])
def test_grpo_on_two_engine_servers_rolls_out_each_step_with_that_steps_weights(tmp_path, sync):
    from slime_ext.orchestration.driver import main

    assert main(job_args(tmp_path, *SERVERS, f"sglang.weight_sync={sync}")) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        # every rollout of step t came from version t (the loop refuses any other), on both engines
        assert r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == r["step"]
        assert r["rollout/engines_used"] == 2
        assert r["time/sync_push"] > 0 and "reward/mean" in r
    assert sorted(p.name for p in (run_dir / "engine_logs").iterdir()) == ["engine_0.log", "engine_1.log"]
