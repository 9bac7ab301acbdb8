"""Engine servers as one engine: group dispatch, weight versions, weight-sync paths, restart after a kill.

The servers are real processes (`python -m slime_ext.tools.serve` over a tiny random Qwen3-MoE), owned by
`EngineServerActor` objects (plain objects here; Ray actors in the loop) and driven by `ServerEnginePool`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.config.sections import SGLangConfig
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.engine_server import EngineServerActor
from slime_ext.engine.failures import EngineUnavailable, StaleRollout, WeightSyncError
from slime_ext.engine.server_pool import ServerEnginePool, group_key
from slime_ext.orchestration.rollout_manager import check_weight_versions
from tests.serving.test_serve import model_dir  # noqa: F401 - the tiny served checkpoint (a module fixture)


def _requests(n_prompts: int = 4, n: int = 3, max_new: int = 16, tag: str = "r") -> list[GenerateRequest]:
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    return [GenerateRequest(f"{tag}{p}-{k}", [5 + p, 7, 9, 11 + p], sp, seed=1000 * p + k)
            for p in range(n_prompts) for k in range(n)]


@pytest.fixture(scope="module")
def pool(model_dir, tmp_path_factory):
    cfg = SGLangConfig(num_engines=2, max_restarts=1, startup_timeout_s=120, request_timeout_s=60)
    logs = tmp_path_factory.mktemp("logs")
    actors = [EngineServerActor(i, cfg, str(model_dir), log_dir=str(logs)) for i in range(2)]
    try:
        urls = [a.start() for a in actors]
        from slime_ext.tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
        yield ServerEnginePool(actors, urls, cfg, str(tmp_path_factory.mktemp("w")), base_dir=str(model_dir),
                               client_kwargs={"eos_token_id": tok.eos_token_id, "tokenizer_path": str(model_dir)})
    finally:
        for a in actors:
            a.stop()


def test_a_prompt_group_goes_to_one_engine_and_groups_balance():
    cfg = SGLangConfig(num_engines=2)
    pool = ServerEnginePool([object(), object()], ["http://127.0.0.1:1", "http://127.0.0.1:2"], cfg, "/tmp/unused")
    reqs = _requests(n_prompts=4, n=3)
    engine_of = pool._assign(reqs)
    by_group: dict[str, set[int]] = {}
    for r, e in zip(reqs, engine_of):
        by_group.setdefault(group_key(r), set()).add(e)
    assert all(len(v) == 1 for v in by_group.values())  # a group never splits (one prefix cache)
    assert sorted(engine_of.count(e) for e in (0, 1)) == [6, 6]  # 4 groups of 3 -> 2 groups per engine
    pool._outstanding = [5, 0]  # engine 0 busy: new groups go to engine 1 until the loads meet
    engine_of = pool._assign(reqs)
    assert engine_of.count(1) == 9 and engine_of.count(0) == 3


def test_an_affinity_key_sticks_to_the_engine_that_served_it():
    """A multi-turn episode's later turns (new input ids, the prompt's affinity key) go where its first turn
    went, whatever the load; requests without a key are placed as before."""
    cfg = SGLangConfig(num_engines=2)
    pool = ServerEnginePool([object(), object()], ["http://127.0.0.1:1", "http://127.0.0.1:2"], cfg, "/tmp/unused")
    sp = SamplingParams(max_new_tokens=4)
    first = [GenerateRequest(f"e{p}-{k}", [5 + p, 7], sp, seed=k, affinity=f"p{p}") for p in range(4) for k in range(2)]
    served = {r.affinity: e for r, e in zip(first, pool._assign(first))}
    assert sorted(served.values()) == [0, 0, 1, 1]
    pool._outstanding = [10, 0]  # engine 0 busy: a new group would go to engine 1
    later = [GenerateRequest(f"e{p}-{k}-t1", [5 + p, 7, 9, 10 + k], sp, seed=k, affinity=f"p{p}")
             for p in range(4) for k in range(2)]
    assert pool._assign(later) == [served[r.affinity] for r in later]
    assert pool._assign([GenerateRequest("x", [5, 7, 9, 10], sp, seed=0)]) == [1]


def test_multi_turn_episodes_stay_on_their_engine_and_hit_its_prefix_cache(pool, model_dir):
    from slime_ext.envs.rollout import EpisodeLimits, run_episodes
    from slime_ext.tokenizer import load_tokenizer
    from tests.envs.conftest import RecordingEngine, ScriptedEnv

    tok = load_tokenizer(model_dir)
    engine = RecordingEngine(pool)
    requests = _requests(n_prompts=4, n=2, max_new=8, tag="mt")
    episodes = run_episodes(engine.generate, requests, [{}] * len(requests),
                            ScriptedEnv(done_after=3, eos_token_id=tok.eos_token_id), tok, EpisodeLimits(3, 200))
    calls = engine.by_rid()
    for e in episodes:
        engines = {calls[t.rid][1].served_by for t in e.turns}
        assert len(engines) == 1, (e.rid, engines)
        assert all(t.cached_tokens >= prev.input_len + prev.generated - 1 for prev, t in zip(e.turns, e.turns[1:]))
    assert sum(len(e.turns) == 3 for e in episodes) >= 2, [(len(e.turns), e.finish) for e in episodes]


def test_stale_versions_are_refused():
    reqs = _requests(1, 2)
    ok = [SimpleNamespace(weight_version="3", finish_reason="stop"), SimpleNamespace(weight_version=None, finish_reason="stop")]
    check_weight_versions(reqs, ok, 3)
    stale = [SimpleNamespace(weight_version="3", finish_reason="stop"), SimpleNamespace(weight_version="2", finish_reason="stop")]
    with pytest.raises(StaleRollout, match=r"other than 3.*'r0-1', '2'"):
        check_weight_versions(reqs, stale, 3)


def _named(model_dir, scale: float) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return [(n, t * scale if t.is_floating_point() and "norm" not in n else t) for n, t in weights.items()]


def _use(pool, kind: str, delta: bool = False, **extra) -> None:
    pool.cfg = pool.cfg.model_copy(update={"weight_sync": kind, "weight_sync_delta": delta, **extra})


def _source(named, bucket_kb: int = 64):
    from slime_ext.engine.weight_sync import LocalWeightSource

    return LocalWeightSource(named, bucket_bytes=bucket_kb << 10)


@pytest.mark.parametrize("kind", ["disk", "tensor", "distributed"])
def test_every_sync_path_delivers_the_weights_and_the_version(pool, model_dir, kind):
    _use(pool, kind)
    version = {"disk": "1", "tensor": "2", "distributed": "3"}[kind]
    base = pool.generate(_requests(tag=f"{kind}-base"))
    named = _named(model_dir, 1.5)
    timings = pool.sync_weights(_source(named), version)  # 64 KiB buckets: several per sync
    assert pool.versions() == [version, version]
    assert {"time/sync_push", "time/sync_commit", "sync/engines_at_version", "sync/bytes_sent"} <= set(timings)
    assert timings["sync/engines_at_version"] == 2
    full = sum(t.numel() * 4 for _, t in named)  # float32 engines
    assert timings["sync/bytes_sent"] == full  # dense tensor syncs are SGLang flattened buckets: the tensors only
    after = pool.generate(_requests(tag=f"{kind}-after"))
    assert {r.weight_version for r in after} == {version}
    # the scaled weights change the logprobs of the same tokens' distribution: the outputs differ
    assert [r.logprobs for r in after] != [r.logprobs for r in base]
    assert {pool.served[0] > 0, pool.served[1] > 0} == {True}
    pool.sync_weights(_source(_named(model_dir, 1.0)), version)  # back to the checkpoint's weights
    assert [r.output_ids for r in pool.generate(_requests(tag=f"{kind}-base"))] == [r.output_ids for r in base]
    if kind == "disk":  # the version's directory: one file per bucket and an HF index over them
        import json

        index = json.loads((pool.weights_dir / f"v{version}" / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == {n for n, _ in named} and len(set(index["weight_map"].values())) > 1


def test_delta_sync_sends_only_the_changed_elements_and_lands_the_same_weights(pool, model_dir):
    _use(pool, "tensor", delta=True)
    named = _named(model_dir, 1.0)
    first = pool.sync_weights(_source(named), "20")  # nothing known yet: dense
    assert first["sync/changed_share"] == 1.0
    reference = pool.generate(_requests(tag="delta-ref"))
    changed = [(n, t.clone()) for n, t in named]
    target_name, target = next((n, t) for n, t in changed if n.endswith("mlp.gate.weight"))
    target.view(-1)[:5] += 0.25  # five elements of one tensor
    second = pool.sync_weights(_source(changed), "21")
    elements = sum(t.numel() for _, t in named)
    assert second["sync/changed_share"] == 5 / elements
    assert second["sync/bytes_sent"] == 5 * (4 + 4) + 8 * len(named)  # int32 index + float32 value, checksums
    assert pool.clients[0]._request("POST", "/get_weights_by_name", {"name": target_name, "truncate_size": 1})[0][:5] \
        == pytest.approx(target.view(-1)[:5].tolist())
    pool.sync_weights(_source(named), "22")  # and back, by delta too
    assert [r.output_ids for r in pool.generate(_requests(tag="delta-ref"))] == [r.output_ids for r in reference]
    _use(pool, "disk")


def test_a_corrupted_bucket_fails_its_checksum_and_the_sync_stops(pool, model_dir):
    from sglang_patches import weight_payload
    from slime_ext.engine.weight_sync import on_all_engines

    _use(pool, "tensor")
    named = _named(model_dir, 1.0)
    pool.sync_weights(_source(named), "30")
    name, value = named[3]
    entries, _ = weight_payload.encode(name, value.float(), None)
    entries[0][1].view(-1)[0] += 1.0  # corrupted in flight, after the trainer took its checksum
    with pytest.raises(WeightSyncError, match=f"{name}.*checksum"):
        on_all_engines(pool.clients, "update_weights_from_tensor",
                       lambda i, c: c.update_weights_from_tensor(entries, load_format=weight_payload.LOADER))
    assert pool.versions() == ["30", "30"]
    pool.sync_weights(_source(named), "30")
    _use(pool, "disk")


def test_snapshot_every_writes_a_sharded_restore_point_from_the_source(pool, model_dir):
    """sglang.snapshot_every: N: with tensor sync no version directory exists, except every N-th sync,
    written by the senders (shards + index) and recorded as the restore point of its version."""
    _use(pool, "tensor", snapshot_every=2)
    syncs_before = pool.syncs
    named = _named(model_dir, 1.0)
    for version in ("50", "51", "52"):
        pool.sync_weights(_source(named), version)
    snapshot, snapshot_version, current = pool.restore_point()
    snapped = "51" if (syncs_before + 2) % 2 == 0 else "52"  # the pool's count of syncs decides which
    assert current == "52" and snapshot_version == snapped and snapshot.endswith(f"v{snapped}")
    from megatron_glue.checkpoint_io import load_hf_checkpoint

    _, stored = load_hf_checkpoint(snapshot)
    assert set(stored) == {n for n, _ in named} and all(torch.equal(stored[n], t.float()) for n, t in named)
    written = {f"v{50 + i}" for i in range(3) if (syncs_before + 1 + i) % 2 == 0}  # every second sync only
    assert {p.name for p in pool.weights_dir.glob("v5*")} == written
    _use(pool, "disk")


def test_a_failed_update_stops_with_a_message_and_keeps_the_old_version(pool, model_dir):
    _use(pool, "disk")
    pool.sync_weights(_source(_named(model_dir, 1.0)), "7")
    bad = _named(model_dir, 1.0) + [("model.layers.0.no_such_weight", torch.zeros(3))]
    with pytest.raises(WeightSyncError, match="no_such_weight"):
        pool.sync_weights(_source(bad), "8")
    assert pool.versions() == ["7", "7"]
    with pytest.raises(StaleRollout):  # step 8 would have rolled out with version 7
        reqs = _requests(1, 2, tag="stale")
        check_weight_versions(reqs, pool.generate(reqs), 8)


def _stopped(tmp_path, call) -> str:
    """The message the loop stops with when `call` fails as it would inside a step."""
    from slime_ext.orchestration.run_dir import RunStopped
    from slime_ext.orchestration.training_job import stop_on_actor_failure

    with pytest.raises(RunStopped) as stopped:
        with stop_on_actor_failure("step 7", tmp_path, tmp_path / "checkpoints"):
            call()
    return str(stopped.value)


def test_checksums_hold_each_sync_to_the_senders_and_the_engines_to_each_other(pool, model_dir, tmp_path):
    _use(pool, "tensor")
    named = _named(model_dir, 1.25)
    out = pool.sync_weights(_source(named), "140")
    assert out["sync/checksum_engines"] == 2
    # the server holds every HF-named tensor as sent except the experts (fused in transformers' model)
    assert out["sync/checksum_tensors_vs_senders"] == sum(".mlp.experts." not in n for n, _ in named) > 10
    # an engine that lost its weights (reset to random values) is caught by the check and stops the run
    pool.clients[1].check_weights("reset_tensors")
    message = _stopped(tmp_path, lambda: pool.verify_checksums("140", None))
    assert "hold different weights" in message and "during step 7" in message and "Resume with:" in message
    pool.sync_weights(_source(_named(model_dir, 1.0)), "141")  # both engines back on the checkpoint


@pytest.mark.parametrize("where", ["dense", "expert"])
def test_a_corrupted_bucket_is_caught_by_the_checksums_or_the_first_sync_compare(pool, model_dir, tmp_path,
                                                                                 monkeypatch, where):
    """A byte flipped after the sender hashed it: in a tensor the server holds as sent, the checksum against the
    senders catches it; in an expert (fused in the server's model, so no sender hash to match) only the first
    sync's snapshot / reset / sync / compare does, naming the fused tensor."""
    from slime_ext.engine import weight_sync

    real = weight_sync.flat_bucket

    def corrupt(bucket, dtype, device, checksums=None):
        flat, entries = real(bucket, dtype, device, checksums)
        hit = [e for e in entries if (".mlp.experts." in e[0]) == (where == "expert")]
        if hit:
            flat[hit[0][3]] ^= 0xFF  # the first byte of the tensor, after it was hashed
        return flat, entries

    _use(pool, "tensor")
    base = _named(model_dir, 1.0)
    pool.sync_weights(_source(base), "149")  # the engines hold the checkpoint, as at a run's start
    monkeypatch.setattr(weight_sync, "flat_bucket", corrupt)
    if where == "dense":
        message = _stopped(tmp_path, lambda: pool.sync_weights(_source(base), "150"))
        assert "other than the trainer sent" in message and "Resume with:" in message
    else:  # the checksums pass (the engines agree, no sender hash for a fused expert); the compare does not
        message = _stopped(tmp_path, lambda: pool.verify_refit(_source(base), "151"))
        assert "did not reproduce the base checkpoint" in message and "mlp.experts" in message, message
        assert "other than the trainer sent" not in message
    monkeypatch.undo()
    pool.sync_weights(_source(base), "152")  # the engines back on the checkpoint (the snapshot's reference)
    out = pool.verify_refit(_source(base), "153")  # an intact first sync passes the compare
    assert out["sync/refit_verified"] == 1.0


def test_sglang_router_in_front_of_the_engines_gives_the_same_tokens(pool, tmp_path):
    """sglang-router (manual policy, a prompt group per routing key) between the pool and the servers."""
    direct = pool.generate(_requests(tag="routed"))
    pool.start_router(log_path=str(tmp_path / "router.log"))
    try:
        routed = pool.generate(_requests(tag="routed"))
        assert pool.router.stats["requests"] == len(routed)  # every request went through the router
    finally:
        pool._router_server.stop(grace_s=5.0)
        pool.router = pool.router_url = None
    assert [r.output_ids for r in routed] == [r.output_ids for r in direct]
    assert all(r.finish_reason != "failed" for r in routed)


def test_a_killed_server_is_restarted_and_the_step_completes_with_the_same_tokens(pool, model_dir):
    """No snapshot of the current version exists (tensor sync): the restarted server loads the newest
    restore point and the attached weight source brings it to the current weights and version."""
    _use(pool, "tensor")
    current = _source(_named(model_dir, 1.5))
    pool.sync_weights(current, "40")
    pool.attach_weight_source(current)
    snapshot, snapshot_version, version = pool.restore_point()
    assert version == "40" and snapshot_version != "40"
    reference = pool.generate(_requests(n_prompts=4, n=2, max_new=120, tag="kill"))
    pool.take_restart_report()  # start from nothing (the fixture is shared)
    victim = pool.actors[1]
    pid = victim.pid()

    def kill_once_its_requests_are_in_flight() -> None:
        while pool._outstanding[1] == 0:
            time.sleep(0.002)
        time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_its_requests_are_in_flight)
    killer.start()
    results = pool.generate(_requests(n_prompts=4, n=2, max_new=120, tag="kill"))
    killer.join()
    assert victim.pid() != pid and victim.restart_count() == 1
    assert all(r.finish_reason != "failed" for r in results)
    assert [r.output_ids for r in results] == [r.output_ids for r in reference]  # re-sent with the same seeds
    assert {r.weight_version for r in results} == {"40"} and pool.versions() == ["40", "40"]
    # the restart and the re-sent requests are reported once (the driver's console, metrics and run dir)
    report = pool.take_restart_report()
    assert report["restarts"] == 1 and 1 <= report["resent_requests"] <= 8
    (event,) = report["events"]
    assert (event["engine"], event["restart"], event["max_restarts"]) == (1, 1, 1)
    assert event["reason"] == "its server process died" and event["resent_requests"] == report["resent_requests"]
    assert event["url"] == pool.urls[1] and event["time"] > 0
    assert pool.take_restart_report() == {"restarts": 0, "resent_requests": 0, "events": []}
    os.kill(victim.pid(), signal.SIGKILL)  # its one restart (sglang.max_restarts=1) is used up
    time.sleep(0.5)
    with pytest.raises(EngineUnavailable, match="restart"):
        pool.generate(_requests(n_prompts=4, n=2, tag="dead"))
    assert pool.take_restart_report()["restarts"] == 0  # no restart was made: the run stops with the error


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_that_stops_answering_is_restarted(model_dir, tmp_path):
    """SIGSTOP: the process lives but answers nothing; the client times out, /health fails, the actor
    restarts it (SIGTERM + SIGCONT), and the requests are answered by the new process."""
    cfg = SGLangConfig(num_engines=1, max_restarts=1, startup_timeout_s=120, request_timeout_s=3)
    actor = EngineServerActor(0, cfg, str(model_dir), log_dir=str(tmp_path))
    try:
        pool = ServerEnginePool([actor], [actor.start()], cfg, str(tmp_path / "w"))
        reference = pool.generate(_requests(n_prompts=2, n=2, max_new=120, tag="hang"))
        pid = actor.pid()
        threading.Timer(0.1, lambda: os.kill(pid, signal.SIGSTOP)).start()
        results = pool.generate(_requests(n_prompts=2, n=2, max_new=120, tag="hang"))
        assert actor.restart_count() == 1 and actor.pid() != pid
        (event,) = pool.take_restart_report()["events"]
        # requests that finished before the stop were answered at once (continuous batching) and are not re-sent
        assert event["reason"] == "it did not answer /health" and 1 <= event["resent_requests"] <= 4
        assert [r.output_ids for r in results] == [r.output_ids for r in reference]
    finally:
        actor.stop()



class _AdapterSource:
    """What the train group pushes under `train.lora.sync: adapter`: the adapter alone, to the target's engines."""

    def __init__(self, tensors: dict, config: dict):
        self.tensors, self.config, self.pushes = tensors, config, 0

    def push_weights(self, target, version=None, expect_version=None) -> list[dict]:
        from slime_ext.engine.lora_sync import send_lora_adapter

        self.pushes += 1
        return [send_lora_adapter(self.tensors, self.config, target)]


def test_a_restarted_engine_that_served_an_adapter_gets_it_back(model_dir, tmp_path):
    """train.lora.sync = adapter: the engines keep the base and hold the adapter. A killed server comes back with
    the base alone, at the version it started with (the adapter's first load is that version too), so the pool
    sends it the adapter again before the failed requests go out again: the same tokens as before the kill."""
    from transformers import AutoModelForCausalLM

    from slime_ext.engine.engine_server import INITIAL_VERSION
    from slime_ext.engine.lora_sync import LORA_NAME
    from slime_ext.tokenizer import load_tokenizer
    from tests.serving.test_lora_serving import CONFIG, adapter

    cfg = SGLangConfig(num_engines=1, max_restarts=1, startup_timeout_s=120, request_timeout_s=60,
                       weight_sync="tensor")
    actor = EngineServerActor(0, cfg, str(model_dir), log_dir=str(tmp_path))
    try:
        url = actor.start()
        tok = load_tokenizer(model_dir)
        pool = ServerEnginePool([actor], [url], cfg, str(tmp_path / "w"), base_dir=str(model_dir),
                                client_kwargs={"eos_token_id": tok.eos_token_id, "tokenizer_path": str(model_dir)},
                                lora_name=LORA_NAME)
        source = _AdapterSource(dict(adapter(AutoModelForCausalLM.from_pretrained(str(model_dir)),
                                             ("q_proj", "v_proj"), seed=1)), CONFIG)
        pool.attach_weight_source(source)
        pool.sync_weights(source, INITIAL_VERSION)
        reference = pool.generate(_requests(n_prompts=2, n=2, max_new=24, tag="lora"))
        assert all(r.finish_reason != "failed" for r in reference)
        pid = actor.pid()
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        results = pool.generate(_requests(n_prompts=2, n=2, max_new=24, tag="lora"))
        assert actor.pid() != pid and actor.restart_count() == 1 and source.pushes == 2
        assert all(r.finish_reason != "failed" for r in results)
        assert [r.output_ids for r in results] == [r.output_ids for r in reference]
    finally:
        actor.stop()
