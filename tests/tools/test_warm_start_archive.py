"""slime_ext.tools.warm_start_archive: a warm start archived from one cache and restored into an empty one is found
by the job (SFT skipped), bit for bit; a corrupted or conflicting entry is refused with the file named; the archives
committed before the tool (no sidecar) restore to the weights their README names."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from slime_ext.tools.warm_start_archive import ArchiveError, main, pack, sha256_of, sidecar, unpack
from tests.conftest import CONFIGS, REPO


def _finished_warm_start(cache: Path, key: str, weights: bytes = bytes(range(256)) * 40) -> Path:
    entry = cache / "warmstart" / key
    (entry / "hf").mkdir(parents=True)
    (entry / "hf" / "model.safetensors").write_bytes(weights)
    (entry / "hf" / "config.json").write_text('{"hidden_size": 128}\n')
    (entry / "sft_metrics.jsonl").write_text('{"step": 0}\n')
    (entry / "complete").write_text(json.dumps({"steps": 1200}) + "\n")
    return entry


def test_a_restored_warm_start_is_the_one_the_job_finds_and_sft_is_skipped(tmp_path, capsys):
    from slime_ext.config import load_config
    from slime_ext.orchestration.training_job import TrainingJob
    from tests.methods.test_sxs_study import CharTokenizer

    new_cache = tmp_path / "fresh_cache"
    cfg = load_config(CONFIGS / "grpo_v2.yaml", [f"run.cache_dir={new_cache}"]).config
    job = TrainingJob(cfg, tmp_path / "run", [], [], CharTokenizer(), Path("tok"))
    key = job.warm_start_key()
    built = _finished_warm_start(tmp_path / "old_cache", key)
    out = tmp_path / "archive"
    assert main(["pack", str(tmp_path / "old_cache"), key, "--label", "seed0", "--out", str(out)]) == 0
    archive = out / f"seed0-{key}.tar.gz"
    hashes = json.loads(sidecar(archive).read_text())["sha256"]
    assert hashes["hf/model.safetensors"] == sha256_of(built / "hf" / "model.safetensors")
    assert sorted(hashes) == ["complete", "hf/config.json", "hf/model.safetensors", "sft_metrics.jsonl"]

    assert main(["unpack", str(archive), str(new_cache)]) == 0
    assert f"{key}: restored from seed0-{key}.tar.gz (hf/model.safetensors {hashes['hf/model.safetensors']})" \
        in capsys.readouterr().out
    hf_dir = job.run_sft()  # returns before any Ray start: the cache entry is complete
    assert hf_dir == new_cache / "warmstart" / key / "hf"
    assert (hf_dir / "model.safetensors").read_bytes() == (built / "hf" / "model.safetensors").read_bytes()
    assert unpack(archive, new_cache)[1] == "present"  # a second restore changes nothing
    assert [p.name for p in (new_cache / "warmstart").iterdir()] == [key]  # no staging folder left behind


def test_corrupted_archive_and_conflicting_cache_entries_are_refused(tmp_path):
    _finished_warm_start(tmp_path / "cache", "k1")
    archive = pack(tmp_path / "cache", "k1", tmp_path / "archive", "seed0")
    with pytest.raises(ArchiveError, match="exists"):
        pack(tmp_path / "cache", "k1", tmp_path / "archive", "seed0")

    # the cache already holds k1 with other weights: refused, the cached file untouched
    other = tmp_path / "other"
    _finished_warm_start(other, "k1", weights=b"different")
    with pytest.raises(ArchiveError, match=r"not overwritten\): file hf/model.safetensors has SHA-256"):
        unpack(archive, other)
    assert (other / "warmstart" / "k1" / "hf" / "model.safetensors").read_bytes() == b"different"

    # an unfinished entry (SFT stopped midway) is not replaced silently
    half = tmp_path / "half"
    (half / "warmstart" / "k1" / "trainer_ckpt").mkdir(parents=True)
    with pytest.raises(ArchiveError, match="unfinished"):
        unpack(archive, half)
    with pytest.raises(ArchiveError, match="no 'complete' marker"):
        pack(half, "k1", tmp_path / "archive2", "seed0")

    # an archive whose weights are not the ones its sidecar lists: nothing is restored
    forged = _finished_warm_start(tmp_path / "forged", "k1", weights=b"\x01" * 10240)
    bad = tmp_path / "bad" / archive.name
    bad.parent.mkdir()
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(forged, arcname="k1")
    sidecar(bad).write_text(sidecar(archive).read_text())
    empty = tmp_path / "empty"
    with pytest.raises(ArchiveError, match="file hf/model.safetensors has SHA-256"):
        unpack(bad, empty)
    assert not (empty / "warmstart" / "k1").exists()

    # not a warm start: a tarball of one loose file
    loose = tmp_path / "loose.tar.gz"
    with tarfile.open(loose, "w:gz") as tar:
        tar.add(forged / "complete", arcname="complete")
    with pytest.raises(ArchiveError, match="expected one <key>/ folder"):
        unpack(loose, empty)
    assert main(["unpack", str(tmp_path / "nothing.tar.gz"), str(empty)]) == 1


def test_the_committed_duet_v2_archive_restores_the_weights_its_readme_names(tmp_path):
    """Seed 1's warm start, archived by hand with tar before the tool (no sidecar): restored with the layout checked,
    and its weights' SHA-256 is the one results/duet_study_v2/README.md gives."""
    archive = REPO / "results" / "duet_study_v2" / "warm_starts" / "seed1-ae98aad40e883ee3.tar.gz"
    key, what, weights = unpack(archive, tmp_path)
    assert (key, what) == ("ae98aad40e883ee3", "restored")
    sha = weights["hf/model-pp0-00000.safetensors"]
    assert sha == "004a8310631adc924dc3e0f862470d959d158bcb88a0856d460872f40c49b212"
    assert sha in (REPO / "results" / "duet_study_v2" / "README.md").read_text()
    assert (tmp_path / "warmstart" / key / "complete").is_file()
