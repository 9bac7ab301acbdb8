"""Our weight checksums equal SGLang's own (`/weights_checker` on CPU tensors), and our server's checksum answer
has the shape of SGLang's `io_struct.ChecksumInfo`: a sender, our server and SGLang agree on what a hash means."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_patches.weight_hash import overall_checksum, per_engine_checksum, tensor_hash_hex
from slime_ext.serving.weight_checker import WeightChecker, WeightCheckError

pytest.importorskip("sglang")  # the real package (scripts/install_sglang_cpu.sh)
ROOT = Path(__file__).resolve().parents[2]

SGLANG_SIDE = """
import json, sys
sys.path.insert(0, {tests!r})
import sglang_model_host as host
host.install_stubs()
import msgspec, torch
from sglang.srt.managers import io_struct
from sglang.srt.utils.weight_checker import _hash_tensor, overall_checksum
tensors = torch.load({path!r})
checksums = {{name: _hash_tensor(t) for name, t in tensors.items()}}
info = json.loads(open({answer!r}).read())["ranks"][0]
msgspec.convert(info, io_struct.ChecksumInfo)  # our answer decodes as SGLang's wire type (raises otherwise)
print(json.dumps({{"checksums": checksums, "overall": overall_checksum(checksums)}}))
"""


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"a.weight": torch.randn(7, 3, generator=g), "b.weight": torch.randn(5, generator=g).to(torch.bfloat16),
            "c.odd": torch.randint(-5, 5, (3,), generator=g).to(torch.int8), "d.t": torch.randn(4, 6, generator=g).t()}


def test_our_checksums_are_sglangs(tmp_path):
    tensors = _tensors()
    torch.save(tensors, tmp_path / "t.pt")
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(tensors["a.weight"].clone())
    answer = WeightChecker(lambda: model).handle("checksum")
    (tmp_path / "answer.json").write_text(json.dumps(answer))
    code = SGLANG_SIDE.format(tests=str(ROOT / "tests"), path=str(tmp_path / "t.pt"), answer=str(tmp_path / "answer.json"))
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {name: tensor_hash_hex(t) for name, t in tensors.items()}
    assert ours == theirs["checksums"] and overall_checksum(ours) == theirs["overall"]
    assert len(set(ours.values())) == len(ours)  # distinct tensors, distinct hashes
    assert answer["per_engine_checksum"] == per_engine_checksum([answer["ranks"][0]["per_gpu_checksum"]])


def test_the_checker_snapshot_reset_compare_cycle_names_what_differs():
    model = torch.nn.Linear(4, 3)
    model.register_buffer("inv_freq", torch.ones(2))  # non-persistent: skipped as SGLang skips it
    checker = WeightChecker(lambda: model)
    with pytest.raises(WeightCheckError, match="snapshot first"):
        checker.handle("compare")
    original = {n: t.detach().clone() for n, t in model.state_dict().items()}
    checker.handle("snapshot")
    checker.handle("reset_tensors")
    assert not torch.equal(model.weight, original["weight"]) and torch.equal(model.inv_freq, original["inv_freq"])
    with torch.no_grad():
        model.weight.copy_(original["weight"])  # the sync brings back the weight, not the bias
    with pytest.raises(WeightCheckError, match=r"name=bias") as failed:
        checker.handle("compare")
    assert "name=weight" not in str(failed.value)
    assert set(checker.handle("checksum")["ranks"][0]["checksums"]) == {"weight", "bias"}
    with pytest.raises(WeightCheckError, match="Unsupported action"):
        checker.handle("explode")
