"""The step-0 consistency check in the loop: it runs before the first update and stops a run whose trainer and
engine disagree, with nothing trained and no checkpoint written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_ext.data import Sample
from slime_ext.orchestration.consistency import ConsistencyError
from tests.orchestration.test_resume import FakeEngine, FakeGroup, FakeManager, fake_job


class SampleManager(FakeManager):
    def rollout(self, step: int) -> tuple[list, dict]:
        s = Sample("a", [1, 2], [3, 4, 5], logprobs=[-1.0, -2.0, -0.5], advantage=1.0)
        return [[s]], {"reward/mean": 0.5, "response_len/mean": 3.0}


class LogprobGroup(FakeGroup):
    def __init__(self, offset: float):
        super().__init__()
        self.offset = offset
        self.calls: list[str] = []

    def first(self, method: str, *args):
        self.calls.append(method)
        if method == "compute_logprobs":
            return {"logprobs": {"a": torch.tensor([-1.0, -2.0, -0.5]) + self.offset}}
        return super().first(method, *args)


def run(tmp_path: Path, offset: float) -> tuple[LogprobGroup, Path]:
    job = fake_job(tmp_path, steps=2)
    job.cfg.train.check_consistency_at_start = True
    group = LogprobGroup(offset)
    job._rl_loop(0, SampleManager(), group, FakeEngine(), tmp_path / "checkpoints")
    return group, tmp_path


def test_matching_logprobs_pass_and_are_logged_at_step_0_only(tmp_path):
    group, run_dir = run(tmp_path, offset=2e-4)
    assert group.calls == ["compute_logprobs", "train_step", "train_step"]
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["consistency/abs_diff_mean"] == pytest.approx(2e-4, rel=1e-3)
    assert rows[0]["consistency/tolerance"] == 1e-3 and "consistency/abs_diff_mean" not in rows[1]


def test_a_mismatch_stops_the_run_before_the_first_update(tmp_path):
    job = fake_job(tmp_path, steps=2)
    job.cfg.train.check_consistency_at_start = True
    group = LogprobGroup(offset=0.05)
    with pytest.raises(ConsistencyError, match=r"mean \|logp_trainer - logp_engine\| = 0\.05 .*exceeds "
                                                r"train.consistency_tolerance = 0.001.*Nothing was trained"):
        job._rl_loop(0, SampleManager(), group, FakeEngine(), tmp_path / "checkpoints")
    assert group.calls == ["compute_logprobs"]  # no train_step, no checkpoint, no metrics row
    assert not (tmp_path / "checkpoints").exists()
    metrics = tmp_path / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()
