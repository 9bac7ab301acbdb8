"""The training loop with `rollout.engine: sglang`: engine server processes (the project's SGLang-protocol
server on CPU), driven only through SGLangEngineClient, weights synced after every step."""

from __future__ import annotations

import pytest

from slime_ext.studies import read_metrics
from tests.e2e.engine_killer import kill_server_after_step_0
from tests.e2e.test_training_job import job_args

SERVERS = ["rollout.engine=sglang", "sglang.num_engines=2", "sft.steps=3", "train.steps=2",
           "run.stages=[data,tokenizer,sft,rl]"]


@pytest.mark.slow  # the default run has the loop on SGLang-protocol engines in tests/e2e/test_multinode.py
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
        # colocated tensor refit: each of the two data-parallel ranks sends to the engine on its own device;
        # disk: the stage's one sender writes the shards
        assert r["sync/senders"] == (2 if sync == "tensor" else 1)
    assert sorted(p.name for p in (run_dir / "engine_logs").iterdir()) == ["engine_0.log", "engine_1.log"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_async_k2_with_engine_side_pauses_on_an_engine_server(tmp_path, mode):
    """rollout.max_staleness 2 with partial rollouts paused inside the engine server (SGLang's /pause_generation
    and /continue_generation around every sync, per-token versions from meta_info.weight_versions): the run ends,
    the manager re-sends nothing, and no trained token is more than 2 versions behind."""
    from slime_ext.orchestration.driver import main

    args = ["rollout.engine=sglang", "sglang.num_engines=1", "sft.steps=3", "train.steps=5",
            "run.stages=[data,tokenizer,sft,rl]", "rollout.max_staleness=2", "rollout.partial_rollouts=true",
            "rollout.stale_tokens=correct", f"rollout.pause_mode={mode}"]
    assert main(job_args(tmp_path, *args)) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(5))
    assert max(r["rollout/staleness_max"] for r in rows) <= 2
    assert all(r["rollout/partial_aborted"] == 0.0 for r in rows)  # the engine kept its requests
    assert all(r["async/dropped_groups"] == 0.0 for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_engine_server_killed_mid_run_shows_on_the_console_in_the_metrics_and_in_the_run_dir(tmp_path, capsys):
    """SIGKILL to the engine server after step 0's row: step 1's requests fail, the rollout manager (a Ray
    actor, whose log the driver does not show) restarts it and re-sends them, and the driver prints the
    restart, logs `engine/restarts` / `engine/resent_requests` for step 1 (0 for the other steps) and
    appends the event to engine_events.jsonl (issue 28, item 4)."""
    import json
    import re

    from slime_ext.orchestration.driver import main

    killer, killed = kill_server_after_step_0(tmp_path / "runs", lambda cmd: str(tmp_path) in cmd)
    args = ["rollout.engine=sglang", "sglang.num_engines=1", "sft.steps=3", "train.steps=3",
            "run.stages=[data,tokenizer,sft,rl]"]
    assert main(job_args(tmp_path, *args)) == 0
    killer.join(timeout=5)
    assert killed, "the engine server was never found to kill"
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["engine/restarts"] for r in rows] == [0.0, 1.0, 0.0]
    resent = rows[1]["engine/resent_requests"]
    assert 1 <= resent <= 32 and rows[0]["engine/resent_requests"] == rows[2]["engine/resent_requests"] == 0.0
    out = capsys.readouterr().out
    assert re.search(rf"\[step 1\] engine 0 restarted \(1/2\): its server process died; {int(resent)} request\(s\) "
                     r"re-sent", out), out[-2000:]
    (line,) = (run_dir / "engine_events.jsonl").read_text().splitlines()
    event = json.loads(line)
    assert (event["step"], event["engine"], event["restart"], event["max_restarts"]) == (1, 0, 1, 2)
    assert event["reason"] == "its server process died" and event["resent_requests"] == resent
