"""Weight buckets from a trainer rank to an engine: payload encoding (dense, sparse delta, checksums), the
sender's counts, the embedded engine's apply-and-verify, and a corrupted bucket stopping the run."""

from __future__ import annotations

import pytest
import torch

from sglang_patches import weight_payload
from slime_ext.engine.failures import WeightSyncError
from slime_ext.engine.held_weights import HeldWeights, held_weights
from slime_ext.engine.weight_sync import EmbeddedTarget, LocalWeightSource, ServerTarget, forget_sender_state, merge_stats
from tests.serving.test_serve import model_dir  # noqa: F401 - the tiny served checkpoint (a module fixture)


def test_checksum_changes_with_any_element_and_with_order():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    base = weight_payload.checksum(t)
    assert weight_payload.checksum(t.clone()) == base
    flipped = t.clone()
    flipped.view(-1)[5] = torch.nextafter(flipped.view(-1)[5], torch.tensor(10.0))  # one ulp
    assert weight_payload.checksum(flipped) != base
    swapped = t.clone().view(-1)
    swapped[[2, 3]] = swapped[[3, 2]]
    assert weight_payload.checksum(swapped) != base
    assert weight_payload.checksum(t.to(torch.bfloat16)) != weight_payload.checksum(t.to(torch.bfloat16) * 2)


def test_encode_picks_dense_sparse_or_nothing_and_apply_restores_the_value():
    prev = torch.randn(64, 8).to(torch.bfloat16)
    new = prev.clone()
    new.view(-1)[[3, 100, 511]] += 1.0
    entries, changed = weight_payload.encode("w", new, prev)
    names = [n for n, _ in entries]
    assert changed == 3 and names == ["w@idx", "w@val", "w@sum"]
    assert entries[0][1].tolist() == [3, 100, 511] and entries[0][1].dtype == torch.int32
    assert weight_payload.payload_bytes(entries) == 3 * (4 + 2) + 8
    held = {"w": prev.clone()}
    assert weight_payload.apply_payload(entries, held.__getitem__) == 1
    assert torch.equal(held["w"], new)
    # unchanged: only the checksum travels; unknown previous: dense
    same, n_same = weight_payload.encode("w", new, new.clone())
    assert [n for n, _ in same] == ["w@sum"] and n_same == 0
    dense, n_dense = weight_payload.encode("w", new, None)
    assert [n for n, _ in dense] == ["w", "w@sum"] and n_dense == new.numel()
    # more than a third changed (6 bytes per sparse element vs 2 dense): dense is smaller and is chosen
    many = prev.clone() + 1.0
    assert [n for n, _ in weight_payload.encode("w", many, prev)[0]] == ["w", "w@sum"]


def test_apply_writes_through_a_non_contiguous_expert_slice():
    fused = torch.zeros(2, 6, 4)
    view = fused[1, 3:]  # e.g. experts.1.up_proj inside gate_up_proj: not contiguous in memory
    value = torch.randn(3, 4)
    entries, _ = weight_payload.encode("up", value, torch.zeros(3, 4))
    weight_payload.apply_payload(entries, lambda name: fused[1, 3:])
    assert torch.equal(view, value) and fused[0].abs().sum() == 0


def test_a_corrupted_or_partial_payload_fails_its_checksum_by_name():
    held = {"a": torch.zeros(5), "b": torch.zeros(5)}
    entries = weight_payload.encode("a", torch.ones(5), None)[0] + weight_payload.encode("b", torch.full((5,), 2.0), None)[0]
    corrupt = [(n, t.clone()) for n, t in entries]
    corrupt[2][1][4] = 7.0  # b's dense value, changed after the checksum was taken
    with pytest.raises(weight_payload.ChecksumMismatch, match="'b' fails its checksum"):
        weight_payload.apply_payload(corrupt, held.__getitem__)
    partial = [(n, t) for n, t in entries if n != "a"]  # a's value lost in flight, its checksum arrived
    held = {"a": torch.zeros(5), "b": torch.zeros(5)}
    with pytest.raises(weight_payload.ChecksumMismatch, match="'a'"):
        weight_payload.apply_payload(partial, held.__getitem__)
    with pytest.raises(ValueError, match="indices outside"):
        weight_payload.check_payload([("a@idx", torch.tensor([9])), ("a@val", torch.tensor([1.0]))], held.__getitem__)


def _weights(model_dir) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    named = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        named.update(load_file(str(f)))
    return list(named.items())


def test_delta_sync_to_the_embedded_engine_lands_the_trainer_weights(model_dir):
    from slime_ext.engine.embedded import EmbeddedEngine

    forget_sender_state()
    engine = EmbeddedEngine.from_pretrained(str(model_dir))
    target = EmbeddedTarget(engine, "float32", delta=True)
    named = [(n, t * 1.25 if t.is_floating_point() else t) for n, t in _weights(model_dir)]
    first = merge_stats(LocalWeightSource(named, bucket_bytes=32 << 10).push_weights(target))
    assert first["changed"] == first["elements"] and first["buckets"] > 1  # nothing known yet: dense
    moved = [(n, t.clone()) for n, t in named]
    moved[2][1].view(-1)[:7] -= 0.5
    second = merge_stats(LocalWeightSource(moved, bucket_bytes=32 << 10).push_weights(target))
    assert second["changed"] == 7 and second["bytes_sent"] == 7 * 8 + 8 * len(named)
    for name, value in moved:
        assert torch.equal(engine.parameter(name), value.float()), name
    # a full sync (after an engine restart) drops the copy: the next delta sync knows nothing and is dense
    LocalWeightSource(moved).push_weights(EmbeddedTarget(engine, "float32", delta=False))
    third = merge_stats(LocalWeightSource(moved).push_weights(target))
    assert third["changed"] == third["elements"]
    assert held_weights(target, "local").nbytes() == 4 * third["elements"]
    # only payloads carry deltas: disk and NCCL targets keep no copy
    assert held_weights(ServerTarget("distributed", ["http://x"], delta=True), "pp0") is None
    assert held_weights(ServerTarget("tensor", ["http://x"], delta=True), "pp0") is not None
    forget_sender_state()


def test_a_payload_wire_gets_each_bucket_in_parts_of_a_quarter_with_every_tensor_once():
    """8 tensors of 1000 fp32 elements to a bf16 engine: the bucket is 16000 engine bytes, a part closes at
    4000; a dense tensor's entries are 2000 + 8 (its checksum) bytes, so each part holds two tensors; the
    second sync (two tensors moved by 3 elements each) sends one part of checksums and 6 sparse entries."""
    from slime_ext.engine.weight_sync import Sender

    class Recording:
        payloads = True

        def __init__(self):
            self.sent = []

        def send(self, payload):
            self.sent.append(list(payload))

        def close(self):
            return {}

    forget_sender_state()
    target = EmbeddedTarget(handle=None, engine_dtype="bfloat16", delta=True)
    torch.manual_seed(3)
    weights = [(f"w{i}", torch.randn(1000)) for i in range(8)]
    wire = Recording()
    sender = Sender(target, "parts", wire)
    bucket = [(n, t.clone()) for n, t in weights]
    sender.send(bucket)
    stats = sender.close()
    assert bucket == [] and stats["buckets"] == 1 and stats["payloads"] == 4 and len(wire.sent) == 4
    assert [[n for n, _ in part if "@" not in n] for part in wire.sent] == [["w0", "w1"], ["w2", "w3"], ["w4", "w5"],
                                                                             ["w6", "w7"]]
    assert stats["bytes_full"] == 16000 and stats["bytes_sent"] == 8 * 2008
    engine = {n: torch.zeros(1000, dtype=torch.bfloat16) for n, _ in weights}
    for part in wire.sent:
        weight_payload.apply_payload(part, engine.__getitem__)
    assert all(torch.equal(engine[n], t.bfloat16()) for n, t in weights)
    # what the engines hold, in their dtype, as a rank keeps it: views into one buffer (not one allocation
    # per tensor)
    held = HeldWeights(torch.bfloat16)
    held.record(dict(weights))
    assert len({held.values[n].untyped_storage().data_ptr() for n, _ in weights}) == 1
    assert all(torch.equal(held.values[n], t.bfloat16()) for n, t in weights) and held.nbytes() == 16000

    moved = [(n, t.clone()) for n, t in weights]
    for i in (2, 5):
        moved[i][1][:3] += 1.0  # changes the bf16 values too
    wire.sent.clear()
    sender = Sender(target, "parts", wire)
    before = [(n, held.values[n]) for n, _ in moved]
    sender.send([(n, t.clone()) for n, t in moved], before)
    stats = sender.close()
    # 8 checksums (64 bytes) + 2 x 3 x (4-byte index + 2-byte value): 100 bytes, one part
    assert stats["changed"] == 6 and stats["bytes_sent"] == 100 and len(wire.sent) == 1 and before == []
    weight_payload.apply_payload(wire.sent[0], engine.__getitem__)
    assert all(torch.equal(engine[n], t.bfloat16()) for n, t in moved)
    # without delta sync the same `before` is ignored: every tensor dense
    wire.sent.clear()
    sender = Sender(EmbeddedTarget(handle=None, engine_dtype="bfloat16", delta=False), "parts", wire)
    sender.send([(n, t.clone()) for n, t in moved], [(n, held.values[n]) for n, _ in moved])
    assert sender.close()["changed"] == 8000
    forget_sender_state()


def test_local_buckets_close_before_the_tensor_that_would_overflow_them():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([100, 100, 100, 300, 50, 50])]  # fp32: 4 bytes each
    sizes = [[t.numel() for _, t in b] for b in LocalWeightSource(named, bucket_bytes=800).buckets()]
    assert sizes == [[100, 100], [100], [300], [50, 50]]


def test_a_corrupted_bucket_stops_the_run_with_the_resume_command(model_dir, tmp_path):
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.orchestration.run_dir import RunStopped
    from slime_ext.orchestration.training_job import stop_on_actor_failure

    engine = EmbeddedEngine.from_pretrained(str(model_dir))

    class FlakyLink:
        """The engine behind a transport that flips one value of the third bucket."""

        def __init__(self) -> None:
            self.buckets = 0

        def apply_weight_payload(self, payload):
            self.buckets += 1
            if self.buckets == 3:
                name, value = next((n, t) for n, t in payload if not n.endswith("@sum"))
                value.view(-1)[0] += 1.0
            return engine.apply_weight_payload(payload)

    source = LocalWeightSource(_weights(model_dir), bucket_bytes=16 << 10)
    with pytest.raises(WeightSyncError, match="fails its checksum"):
        source.push_weights(EmbeddedTarget(FlakyLink()))
    with pytest.raises(RunStopped, match="Resume with: .*resume="):
        with stop_on_actor_failure("the weight sync after step 3", tmp_path, tmp_path / "checkpoints"):
            source.push_weights(EmbeddedTarget(FlakyLink()))


def test_delta_with_engine_servers_needs_the_tensor_path():
    from slime_ext.config.loader import load_config
    from tests.conftest import CONFIGS

    with pytest.raises(Exception, match="sglang.weight_sync_delta"):  # disk and distributed send dense
        load_config(CONFIGS / "grpo.yaml", ["rollout.engine=sglang", "sglang.weight_sync=disk",
                                            "sglang.weight_sync_delta=true"])
    # auto resolves to tensor on the colocated CPU layout, which carries deltas
    assert load_config(CONFIGS / "grpo.yaml", ["rollout.engine=sglang", "sglang.weight_sync_delta=true"]).config \
        .sglang.weight_sync == "tensor"
    ok = load_config(CONFIGS / "grpo.yaml", ["rollout.engine=sglang", "sglang.weight_sync=tensor",
                                             "sglang.weight_sync_delta=true", "sglang.weight_bucket_mb=64"]).config
    assert ok.sglang.weight_sync_delta and ok.sglang.weight_bucket_mb == 64
    embedded = load_config(CONFIGS / "grpo.yaml", ["sglang.weight_sync_delta=true"]).config  # payloads to the actor
    assert embedded.rollout.engine == "embedded" and embedded.sglang.weight_sync_delta


def test_sparse_delta_found_chunk_by_chunk_equals_the_whole_tensor_comparison(monkeypatch):
    """The delta's positions are found in bounded chunks (the sender's memory); the entries must be exactly
    the whole-tensor comparison's, across chunk borders, in both index dtypes' range."""
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(1000, generator=gen).to(torch.bfloat16)
    new = old.clone()
    changed = torch.randperm(1000, generator=gen)[:97]
    new[changed] += 1.0
    new[0], new[999] = new[0] + 1, new[999] + 1  # the first and last element, on chunk borders
    reference = (new.view(torch.int16) != old.view(torch.int16)).nonzero().view(-1)
    for chunk in (7, 250, 1 << 22):
        monkeypatch.setattr(weight_payload, "_CHUNK", chunk)
        entries, count = weight_payload.encode("w", new, old)
        parts = dict(entries)
        assert count == reference.numel()
        assert parts["w@idx"].dtype == torch.int32 and torch.equal(parts["w@idx"].long(), reference)
        assert torch.equal(parts["w@val"], new[reference])


def test_peak_rss_attributes_a_peak_to_its_phase_and_senders_merge_by_the_largest():
    import time

    from slime_ext.engine.weight_sync import PeakRSS, sync_metrics

    with PeakRSS(interval_s=0.002) as peak:
        peak.phase = "quiet"
        time.sleep(0.05)
        peak.phase = "busy"
        block = torch.ones(50 << 20)  # 200 MiB, touched
        time.sleep(0.05)
        del block
        peak.phase = "quiet"
        time.sleep(0.02)
    assert peak.growth("busy") >= 190 << 20 and peak.growth("quiet") < 50 << 20 and peak.growth() >= peak.growth("busy")
    assert peak.growth("never") == 0
    merged = merge_stats([{"peak_rss_growth": 3 << 20, "bytes_sent": 10, "seconds": 1.0},
                          {"peak_rss_growth": 5 << 20, "bytes_sent": 20, "seconds": 2.0}, None])
    assert merged["peak_rss_growth"] == 5 << 20 and merged["bytes_sent"] == 30 and merged["seconds"] == 2.0
    assert sync_metrics(merged)["memory/sync_sender_growth_mib"] == 5.0


_FREED_MEMORY_PROBE = """
import json, torch
from slime_ext.engine.weight_sync import return_freed_memory, rss_bytes
return_freed_memory()
base = rss_bytes()
held = []
for _ in range(3200):  # 200 MiB of 64 KiB tensors, each followed by a small one that stays alive
    held += [torch.ones(16 * 1024), torch.ones(16)]
kept = held[1::2]
del held
after_free = rss_bytes() - base
return_freed_memory()
print(json.dumps({"kept": len(kept), "after_free": after_free, "after_trim": rss_bytes() - base}))
"""


def test_return_freed_memory_gives_back_heap_pages_that_free_keeps():
    """Tensors under glibc's mmap threshold live in the heap; freeing them between live small blocks leaves
    the pages resident (the premise), and the trim a weight push runs between buckets returns them. In a
    fresh process: the premise depends on the heap's history (glibc raises its mmap threshold after earlier
    large frees), which a long test session makes unpredictable."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-c", _FREED_MEMORY_PROBE], capture_output=True, text=True, timeout=120,
                         cwd=str(REPO), env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    after_free, after_trim = probe["after_free"], probe["after_trim"]
    assert probe["kept"] == 3200
    assert after_free > 150 * 2**20, after_free  # free() alone kept the pages
    assert after_trim < 50 * 2**20, after_trim
