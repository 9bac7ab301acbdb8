"""Several nodes on one machine: a Ray cluster of simulated nodes (`ray.cluster_utils.Cluster`) at distinct
loopback addresses, the trainer placed on one node and the engine servers on another by the plan's custom
resources, weights synced over a gloo group whose rendezvous is the trainer node's address, not 127.0.0.1.

Layout: the head at this machine's address as Ray picks it (the driver, the router), trainer node 127.0.0.2 (`trainer_node`), engine node
127.0.0.3 (`engine_node`, `sglang.host: node` so the servers listen on their node's address)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.studies import read_metrics
from tests.e2e.engine_killer import kill_server_after_step_0
from tests.e2e.test_training_job import job_args

TRAINER, ENGINE = "127.0.0.2", "127.0.0.3"


@pytest.fixture
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"trainer_node": 1}, node_ip_address=TRAINER)
    c.add_node(num_cpus=1, resources={"engine_node": 1}, node_ip_address=ENGINE)
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _args(tmp: Path, cluster, steps: int, *extra: str, cache: Path | None = None) -> list[str]:
    return job_args(tmp, f"cluster.ray_address={cluster.address}", "cluster.trainer_resources={trainer_node: 0.01}",
                    "cluster.engine_resources={engine_node: 0.01}", "rollout.engine=sglang", "sglang.host=node",
                    "sglang.weight_sync=distributed", "sglang.num_engines=1", "sft.steps=3", f"train.steps={steps}",
                    "run.stages=[data,tokenizer,sft,rl]", *extra, cache=cache)


def _engine_log(run_dir: Path) -> str:
    return (run_dir / "engine_logs" / "engine_0.log").read_text()


@pytest.mark.timeout(600)
def test_trainer_and_engines_on_different_nodes_sync_over_the_nodes_addresses(tmp_path, cluster, job_cache):
    from slime_ext.orchestration.driver import main

    assert main(_args(tmp_path, cluster, 2, cache=job_cache)) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == r["step"] for r in rows)
    assert all(r["sync/engines_at_version"] == 1 and r["sync/senders"] == 1 for r in rows)
    log = _engine_log(run_dir)
    assert f"http://{ENGINE}:" in log or f"{ENGINE}:" in log  # the server listens on its node's address
    # the weight-update group's store is hosted by the trainer rank on its own node, never 127.0.0.1
    assert "joining weight update group weight_update_group_pp0_g0" in log and f"at {TRAINER}:" in log
    assert "at 127.0.0.1:" not in log


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_engine_node_server_killed_mid_run_comes_back_at_the_current_version(tmp_path, cluster):
    """SIGKILL to the engine server after step 0's row: it restarts from the base checkpoint (no per-sync
    snapshot), the trainer ranks bring it to the current version over a new group, and the run completes
    with every step's rollouts from that step's version."""
    from slime_ext.orchestration.driver import main

    killer, killed = kill_server_after_step_0(tmp_path / "runs", lambda cmd: f"--host {ENGINE}" in cmd)
    assert main(_args(tmp_path, cluster, 4, "rollout.max_response_len=48")) == 0
    killer.join(timeout=5)
    assert killed, "the engine server was never found to kill"
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == r["step"] for r in rows)
    log = _engine_log(run_dir)
    assert log.count("weight version 0;") == 2  # started twice from the base checkpoint (version 0)
    assert log.count("joining weight update group") == 3  # the first group, the bring-current one, the next sync's
    assert not list((run_dir / "engine_weights").glob("v*"))  # no per-sync snapshot was written
