"""slime_ext.tools.warm_start_archive: a warm start archived from one cache and restored into an empty one is found
by the job (SFT skipped), bit for bit; a corrupted or conflicting entry is refused with the file named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_ext.tools.warm_start_archive import ArchiveError, main, pack, sha256_of, unpack
from tests.conftest import CONFIGS


def _finished_warm_start(cache: Path, key: str) -> Path:
    entry = cache / "warmstart" / key
    (entry / "hf").mkdir(parents=True)
    (entry / "hf" / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (entry / "hf" / "config.json").write_text('{"hidden_size": 128}\n')
    (entry / "complete").write_text(json.dumps({"steps": 1200}) + "\n")
    return entry


def test_a_restored_warm_start_is_the_one_the_job_finds_and_sft_is_skipped(tmp_path):
    from slime_ext.config import load_config
    from slime_ext.orchestration.training_job import TrainingJob
    from tests.methods.test_sxs_study import CharTokenizer

    new_cache = tmp_path / "fresh_cache"
    cfg = load_config(CONFIGS / "grpo_v2.yaml", [f"run.cache_dir={new_cache}"]).config
    job = TrainingJob(cfg, tmp_path / "run", [], [], CharTokenizer(), Path("tok"))
    key = job.warm_start_key()
    built = _finished_warm_start(tmp_path / "old_cache", key)
    archive = tmp_path / "archive"
    assert main(["pack", str(tmp_path / "old_cache"), key, "--out", str(archive)]) == 0
    manifest = json.loads((archive / key / "MANIFEST.json").read_text())
    assert manifest["sha256"]["model.safetensors"] == sha256_of(built / "hf" / "model.safetensors")
    assert manifest["bytes"] == 256 * 40 + len('{"hidden_size": 128}\n')

    assert unpack(archive, new_cache) == {key: "restored"}
    hf_dir = job.run_sft()  # returns before any Ray start: the cache entry is complete
    assert hf_dir == new_cache / "warmstart" / key / "hf"
    assert (hf_dir / "model.safetensors").read_bytes() == (built / "hf" / "model.safetensors").read_bytes()
    assert json.loads((hf_dir.parent / "complete").read_text()) == {"steps": 1200}
    assert unpack(archive, new_cache) == {key: "present"}  # a second restore changes nothing


def test_corrupted_archive_and_conflicting_cache_entries_are_refused(tmp_path):
    _finished_warm_start(tmp_path / "cache", "k1")
    archive = tmp_path / "archive"
    pack(tmp_path / "cache", "k1", archive)
    with pytest.raises(ArchiveError, match="exists"):
        pack(tmp_path / "cache", "k1", archive)

    # the cache already holds k1 with other weights: refused, the cached file untouched
    other = tmp_path / "other"
    _finished_warm_start(other, "k1")
    (other / "warmstart" / "k1" / "hf" / "model.safetensors").write_bytes(b"different")
    with pytest.raises(ArchiveError, match=r"not overwritten\): file model.safetensors has SHA-256"):
        unpack(archive, other)
    assert (other / "warmstart" / "k1" / "hf" / "model.safetensors").read_bytes() == b"different"

    # an unfinished entry (SFT stopped midway) is not replaced silently
    half = tmp_path / "half"
    (half / "warmstart" / "k1" / "trainer_ckpt").mkdir(parents=True)
    with pytest.raises(ArchiveError, match="unfinished"):
        unpack(archive, half)

    # a flipped byte in the archive: nothing is restored
    weights = archive / "k1" / "hf" / "model.safetensors"
    weights.write_bytes(b"\x01" + weights.read_bytes()[1:])
    empty = tmp_path / "empty"
    with pytest.raises(ArchiveError, match="k1: file model.safetensors has SHA-256"):
        unpack(archive, empty)
    assert not (empty / "warmstart" / "k1").exists()

    with pytest.raises(ArchiveError, match="no 'complete' marker"):
        pack(half, "k1", tmp_path / "archive2")
    assert main(["unpack", str(tmp_path / "nothing"), str(empty)]) == 1
