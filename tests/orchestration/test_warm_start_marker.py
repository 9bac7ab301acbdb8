"""The warm start's build id: written with its `complete` marker, recorded by the run's SFT stage, checked where a
run's warm start is loaded again (a resumed run, a study evaluating or streaming it)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_ext.orchestration.warm_start_marker import MARKER, WarmStartMismatch, build_of, check_build, write_marker


def cached_warm_start(root: Path) -> Path:
    hf = root / "warmstart" / "0123abcd" / "hf"
    hf.mkdir(parents=True)
    return hf


def test_marker_carries_a_fresh_build_id_read_from_the_key_or_hf_folder(tmp_path):
    hf = cached_warm_start(tmp_path)
    assert build_of(hf) is None  # no marker: unfinished
    first = write_marker(hf.parent, 1200)
    marker = json.loads((hf.parent / MARKER).read_text())
    assert marker["steps"] == 1200 and marker["build"] == first and len(first) == 32
    assert build_of(hf) == first and build_of(hf.parent) == first
    assert write_marker(hf.parent, 1200) != first  # the same key built again is another build
    (hf.parent / MARKER).write_text(json.dumps({"steps": 1200}) + "\n")  # a marker from before build ids
    assert build_of(hf) is None
    (hf.parent / MARKER).write_text("done\n")  # a file of that name that is not ours
    assert build_of(hf) is None


def test_check_build_refuses_other_weights_under_the_same_key_and_passes_what_it_cannot_check(tmp_path):
    hf = cached_warm_start(tmp_path)
    build = write_marker(hf.parent, 3)
    check_build(hf, build, "here")  # the same build
    check_build(hf, None, "here")  # a run from before build ids
    with pytest.raises(WarmStartMismatch, match=f"seed 2's latency: the warm start {hf} .* is build {build}, but the "
                                                "run trained from build feed"):
        check_build(hf, "feed", "seed 2's latency")
    check_build(tmp_path / "elsewhere" / "hf", "feed", "here")  # not on this machine: nothing to compare


def test_a_resumed_run_records_its_build_and_refuses_a_warm_start_built_again(tmp_path):
    from slime_ext.orchestration.driver import Job

    hf = cached_warm_start(tmp_path)
    first = write_marker(hf.parent, 3)
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def job(resume: bool) -> Job:
        j = Job.__new__(Job)
        j.cfg, j.run_dir, j.data, j.summary = SimpleNamespace(run=SimpleNamespace(resume=resume)), run_dir, None, {}
        j._earlier_sft_build = j._recorded_build() if resume else None
        j._job = SimpleNamespace(run_sft=lambda: hf, sft_report=None)
        return j

    assert job(resume=False).stage_sft()["build"] == first
    (run_dir / "summary.json").write_text(json.dumps({"stages": {"sft": {"warm_start": str(hf), "build": first}}}))
    assert job(resume=True).stage_sft()["build"] == first  # the same weights: resumes
    write_marker(hf.parent, 3)  # built again under the same key (another machine, another archive)
    resumed = job(resume=True)
    with pytest.raises(WarmStartMismatch, match=f"resume={run_dir}: .* trained from build {first}"):
        resumed.stage_sft()


def test_a_study_reads_a_runs_warm_start_only_if_the_cache_holds_its_build(tmp_path):
    from slime_ext.tools.study import warm_start_of

    hf = cached_warm_start(tmp_path)
    build = write_marker(hf.parent, 3)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"stages": {"sft": {"warm_start": str(hf), "build": build}}}))
    assert warm_start_of(run) == str(hf)
    write_marker(hf.parent, 3)
    with pytest.raises(WarmStartMismatch, match=f"the warm start of {run}"):
        warm_start_of(run)
