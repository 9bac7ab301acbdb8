"""Weights leave the trainer ranks bucket by bucket: each pipeline stage's sender writes its own shards,
and the union over stages is the whole model, bit for bit, under every parallel layout."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import kept_ranks, run_ranks
from tests.megatron_fixtures import tiny_moe_config
from tests.megatron_glue.test_parallel import _hf_weights


@pytest.fixture(scope="module", autouse=True)
def _kept_ranks():
    """The layouts share two rank processes (spawned once, not per layout)."""
    with kept_ranks():
        yield


def _loaded_trainer(config, hf_sd, sizes):
    """This rank's trainer in `sizes`, holding its shard of the HF weights `hf_sd` (in a rank process)."""
    from megatron.core import parallel_state as mpu

    from megatron_glue.parallel import init_model_parallel
    from megatron_glue.sharding import shard_megatron_state
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from megatron_glue.weight_names import hf_to_megatron

    init_model_parallel(sizes, seed=11)
    trainer = MegatronTrainer(config, TrainerSettings(lr=1e-3), sizes)
    trainer.load_local_state_dict(dict(shard_megatron_state(
        hf_to_megatron(hf_sd, config), config,
        tp_rank=mpu.get_tensor_model_parallel_rank(), tp_size=sizes.tp,
        ep_rank=mpu.get_expert_model_parallel_rank(), ep_size=sizes.ep,
        pp_rank=mpu.get_pipeline_model_parallel_rank(), pp_size=sizes.pp, etp_size=sizes.expert_tp)))
    return trainer


def _push_worker(rank, config, hf_sd, sizes, directory, bucket_bytes, expert_senders=False):
    from slime_ext.engine.weight_sync import ServerTarget
    from slime_ext.orchestration.train_group import push_from_rank

    trainer = _loaded_trainer(config, hf_sd, sizes)
    target = ServerTarget("disk", [], engine_dtype="bfloat16", directory=directory, expert_senders=expert_senders)
    return push_from_rank(trainer, target, bucket_bytes)


@pytest.mark.parametrize("name, sizes, expert_senders, senders", [
    ("pp2", dict(pp=2), False, 2),  # one sender per pipeline stage
    ("tp2_ep2_etp1", dict(tp=2, ep=2, etp=1, sequence_parallel=True), False, 1),  # rank 0 sends the gathered stage
    ("tp2_ep2_etp1_ep_senders", dict(tp=2, ep=2, etp=1, sequence_parallel=True), True, 2),  # each EP rank its own
])
def test_each_stage_sender_writes_its_own_shards_and_together_they_are_the_model(name, sizes, expert_senders, senders,
                                                                                 tmp_path):
    from megatron_glue.checkpoint_io import load_hf_checkpoint
    from megatron_glue.model_provider import ParallelSizes
    from slime_ext.engine.weight_sync import merge_stats, write_index

    config = tiny_moe_config()
    hf_sd = _hf_weights(config)
    results = run_ranks(_push_worker, 2, config, hf_sd, ParallelSizes(**sizes), str(tmp_path), 8 << 10,
                        expert_senders)
    sent = [r for r in results if r is not None]
    assert len(sent) == senders and len({r["sender"] for r in sent}) == senders
    if expert_senders:  # rank 0: the dense part and experts 0-1; rank 1 (EP rank 1): experts 2-3 and nothing else
        import re

        names = {r["sender"]: set(r["weight_map"]) for r in sent}
        experts = {k: {int(m.group(1)) for n in v if (m := re.search(r"experts\.(\d+)\.", n))} for k, v in names.items()}
        assert experts == {"pp0_ep0": {0, 1}, "pp0_ep1": {2, 3}}
        assert all(".experts." in n for n in names["pp0_ep1"])
        assert sum(".experts." not in n for n in names["pp0_ep0"]) == sum(".experts." not in n for n in hf_sd)
    stats = merge_stats(sent)
    assert stats["buckets"] > 2 and stats["elements"] == sum(t.numel() for t in hf_sd.values())
    assert stats["bytes_sent"] == 2 * stats["elements"]  # bf16 on disk, as the engines run
    write_index(tmp_path, stats["weight_map"], stats["bytes_sent"], None)
    config.save_pretrained(str(tmp_path))
    _, source = load_hf_checkpoint(tmp_path)
    assert set(source) == set(hf_sd)
    for k, v in hf_sd.items():
        assert torch.equal(source[k], v.to(torch.bfloat16)), k
    assert all(r["shard_bytes"] > 0 and r["peak_rss_growth"] >= 0 for r in sent)


def _delta_push_worker(rank, config, hf_sd, sizes, bucket_bytes):
    """Two delta pushes into a bf16 engine living in the sender's process: the first dense, then every
    rank moves element 0 of each of its local tensors and the second sends only what changed."""
    from megatron_glue.weight_export import export_hf_state_dict
    from sglang_patches import weight_payload
    from slime_ext.engine.weight_sync import EmbeddedTarget, forget_sender_state
    from slime_ext.orchestration.train_group import push_from_rank

    forget_sender_state()  # the rank processes are kept between tests
    trainer = _loaded_trainer(config, hf_sd, sizes)

    class Engine:
        def __init__(self):
            self.weights = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in hf_sd.items()}

        def apply_weight_payload(self, payload):
            weight_payload.apply_payload(payload, self.weights.__getitem__)

    engine = Engine()
    target = EmbeddedTarget(engine, "bfloat16", delta=True)
    first = push_from_rank(trainer, target, bucket_bytes)
    before = {k: v.bfloat16() for k, v in export_hf_state_dict(trainer).items()}
    with torch.no_grad():
        for tensor in trainer.local_state_dict().values():
            tensor.view(-1)[0] += 1.0
    after = {k: v.bfloat16() for k, v in export_hf_state_dict(trainer).items()}
    second = push_from_rank(trainer, target, bucket_bytes)
    forget_sender_state()
    if first is None:
        return None
    return {"first": first, "second": second,
            "changed": sum(int((after[k] != before[k]).sum()) for k in after),
            "engine_holds_the_trainer": all(torch.equal(engine.weights[k], after[k]) for k in after)}


def test_delta_sync_across_tp_and_ep_compares_each_rank_own_shard_copy_after_the_gathers():
    """TP2/EP2 with experts whole (slime's 30B layout in miniature): the sender gets the engines' values from
    every rank's copy of its own shard, gathered beside the weights; it holds a copy of its own shard only."""
    from megatron_glue.model_provider import ParallelSizes

    config = tiny_moe_config()
    hf_sd = _hf_weights(config)
    sizes = ParallelSizes(tp=2, ep=2, etp=1, sequence_parallel=True)
    (result,) = [r for r in run_ranks(_delta_push_worker, 2, config, hf_sd, sizes, 8 << 10) if r is not None]
    first, second = result["first"], result["second"]
    elements = sum(t.numel() for t in hf_sd.values())
    assert first["elements"] == second["elements"] == elements and first["changed"] == elements  # dense
    assert 0 < result["changed"] < elements // 100 and second["changed"] == result["changed"]
    assert result["engine_holds_the_trainer"]
    # checksums and the changed elements only: 8 bytes per tensor + (4-byte index + 2-byte value) each
    assert second["bytes_sent"] == 8 * second["tensors"] + 6 * result["changed"]
    # the copy is this rank's shard in bf16 (the shard is fp32), less than the whole stage's bf16 copy
    assert first["held_bytes"] == first["shard_bytes"] // 2 and first["held_bytes"] < 2 * elements


def _set_up_twice_worker(rank, config, sizes):
    """The same RL setup and step on a rank set up once and on the same rank after an SFT trainer ran there
    (a job's RL stage takes its SFT stage's ranks)."""
    from dataclasses import asdict

    from megatron_glue.trainer import TrainerSettings
    from slime_ext.orchestration.train_group import TrainWorker
    from tests.megatron_glue.test_trainer import make_samples

    worker = TrainWorker.__new__(TrainWorker)  # run_ranks made the process group: no rendezvous here
    worker.trainer = worker.weights_version = None

    def rl_setup_and_step() -> tuple[dict, dict, dict]:
        worker.setup(config, TrainerSettings(lr=1e-3, seed=7), asdict(sizes), 0, None)  # random init: seeded
        start = {k: v.detach().clone() for k, v in worker.trainer.local_state_dict().items()}
        metrics = worker.train_step(make_samples(8, seed=3), "grpo")
        return start, metrics, {k: v.detach().clone() for k, v in worker.trainer.local_state_dict().items()}

    once = rl_setup_and_step()
    worker.setup(config, TrainerSettings(lr=5e-3, seed=1), asdict(sizes), 0, None)  # the SFT stage's trainer
    for i in range(2):
        worker.train_step(make_samples(8, seed=10 + i), "sft")
    worker.weights_version = "v1"
    worker.release_trainer()  # as TrainingJob.run_sft hands its ranks on
    released = worker.trainer is None and worker.weights_version is None
    twice = rl_setup_and_step()
    return {"released": released, "version_reset": worker.weights_version is None,
            "start_equal": all(torch.equal(once[0][k], twice[0][k]) for k in once[0]),
            "end_equal": all(torch.equal(once[2][k], twice[2][k]) for k in once[2]),
            "moved": any(not torch.equal(once[0][k], once[2][k]) for k in once[0]),
            "loss": (once[1]["pg_loss"], twice[1]["pg_loss"])}


def test_a_rank_set_up_again_for_rl_matches_a_rank_set_up_once():
    """A job's RL stage sets its trainer up on the SFT stage's ranks (no second process start): the new trainer
    is re-seeded and keeps nothing of the last one (weights, optimizer state, version), under TP2."""
    from megatron_glue.model_provider import ParallelSizes

    for result in run_ranks(_set_up_twice_worker, 2, tiny_moe_config(), ParallelSizes(tp=2, sequence_parallel=True)):
        assert result["released"] and result["version_reset"] and result["moved"]
        assert result["start_equal"] and result["end_equal"], result
        assert result["loss"][0] == result["loss"][1]


def _per_engine_worker(rank, config, hf_sd, sizes, bucket_bytes):
    import torch.distributed as dist
    from sglang.srt.utils.common import MultiprocessingSerializer

    from slime_ext.engine.sglang_client import SGLangEngineClient
    from slime_ext.engine.weight_sync import ServerTarget
    from slime_ext.orchestration.train_group import push_from_rank

    trainer = _loaded_trainer(config, hf_sd, sizes)
    posted = []

    class Capture(SGLangEngineClient):
        def update_weights_from_serialized(self, per_rank, **kw):
            names = []
            for entry in per_rank:
                data = MultiprocessingSerializer.deserialize(entry)  # read now, while the sender holds it
                names.append(sorted(m.name for m in data["metadata"]))
            posted.append((self.base_url, names))

    class Target(ServerTarget):
        def clients(self):
            return [Capture(u, tp_size=self.tp_size, validate=False) for u in self.urls]

    target = Target("tensor", ["http://127.0.0.1:1", "http://127.0.0.1:2"], engine_dtype="bfloat16",
                    rank_engines=True)
    stats = push_from_rank(trainer, target, bucket_bytes)
    dist.barrier()
    return {"rank": rank, "posted": posted, "bytes_sent": stats["bytes_sent"] if stats else None}


def test_colocated_refit_every_rank_sends_its_own_copy_to_the_engine_on_its_device():
    """Two data-parallel ranks colocated with two engines of TP 1: rank r's buckets go to engine r only, each the
    whole model once (no single sender for every engine)."""
    from megatron_glue.model_provider import ParallelSizes

    config = tiny_moe_config()
    hf_sd = _hf_weights(config)
    results = sorted(run_ranks(_per_engine_worker, 2, config, hf_sd, ParallelSizes(), 8 << 10),
                     key=lambda r: r["rank"])
    elements = sum(t.numel() for t in hf_sd.values())
    for r in results:
        urls = {url for url, _ in r["posted"]}
        assert urls == {f"http://127.0.0.1:{r['rank'] + 1}"}, (r["rank"], urls)
        names = [n for _, entries in r["posted"] for (entry,) in [entries] for n in entry]
        assert sorted(names) == sorted(hf_sd) and len(r["posted"]) > 2  # every tensor once, in several buckets
        assert r["bytes_sent"] == 2 * elements  # its own copy of the model in bf16
