"""scripts/opd_study.py's own arithmetic on fake runs: the share of the teacher's lead each arm closes (prompts
pooled over seeds, hand-computed), and the equal-wall-time reading from the scoring share measured in the run."""

from __future__ import annotations

import json

import pytest

from tests.studies.test_studies import _report, study_script


def test_gap_closed_is_the_pooled_ratio_with_an_interval_around_it(tmp_path):
    study = study_script("opd_study")
    # per prompt (4 samples): warm start 1/4 correct, teacher 3/4, so the lead is 0.5 on every prompt
    _report(tmp_path / "warm.json", [[1, 0, 0, 0]] * 20)
    _report(tmp_path / "teacher.json", [[1, 1, 1, 0]] * 20)
    # seed 1 closes half the lead (2/4 correct), seed 2 all of it on half the prompts, none on the rest
    _report(tmp_path / "s1.json", [[1, 1, 0, 0]] * 20)
    _report(tmp_path / "s2.json", [[1, 1, 1, 0]] * 10 + [[1, 0, 0, 0]] * 10)
    g = study.gap_closed({1: tmp_path / "s1.json", 2: tmp_path / "s2.json"}, tmp_path / "teacher.json",
                         tmp_path / "warm.json")
    assert g["teacher_minus_warm"] == pytest.approx(0.5)
    assert g["per_seed"] == pytest.approx([0.5, 0.5])
    assert g["gap_closed"] == pytest.approx(0.5)  # (0.25 + 0.25) / 2 / 0.5
    low, high = g["ci95"]
    assert low < 0.5 < high and high - low < 0.5  # resampling prompts moves seed 2's half
    _report(tmp_path / "other.json", [[1, 0, 0, 0]] * 19)
    with pytest.raises(ValueError, match="other prompts than the teacher"):
        study.gap_closed({1: tmp_path / "other.json"}, tmp_path / "teacher.json", tmp_path / "warm.json")


def test_equal_wall_time_reads_the_curve_at_the_step_the_scoring_share_leaves(tmp_path):
    """40 steps of which the teacher's scoring took 10%: at GRPO's cost OPD reaches step 36, read between the
    evaluations at steps 30 (0.60) and 40 (0.70): 0.66."""
    study = study_script("opd_study")
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "time/step": 10.0, "time/score": 1.0, "reward/mean": 0.5, "opd/reverse_kl": 0.1}
            for i in range(40)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, score in ((10, 0.5), (20, 0.55), (30, 0.6)):
        (run / f"eval_step{step}.json").write_text(json.dumps({"mean@4": score}))
    (run / "eval_final.json").write_text(json.dumps({"mean@4": 0.7, "greedy": 0.8}))
    row = study.row_of(run, warm_mean4=0.45)
    assert row["scoring share"] == pytest.approx(0.1) and row["equal-time step"] == pytest.approx(36.0)
    assert row["mean@4 at GRPO's wall time"] == pytest.approx(0.66)
    assert study.held_out_curve(run) == {10: 0.5, 20: 0.55, 30: 0.6, 40: 0.7}
    assert study.at_step(study.held_out_curve(run), 5, 0.45) == pytest.approx(0.475)  # from the warm start
