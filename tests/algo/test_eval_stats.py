"""Standard errors and paired bootstrap intervals of evaluation differences (slime_ext.eval_stats)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slime_ext.algo.eval_stats import describe_difference, paired_difference, stderr_over_prompts


def test_stderr_is_sample_std_over_sqrt_n():
    # values 0, 1, 1, 0: mean 0.5, sample variance 1/3 -> SE sqrt(1/3)/2
    assert stderr_over_prompts([0, 1, 1, 0]) == pytest.approx(math.sqrt(1 / 3) / 2)
    assert stderr_over_prompts([0.7]) == 0.0


def test_identical_shift_has_zero_width_interval():
    a = [0.0, 0.25, 0.5, 1.0]
    diff = paired_difference(a, [x + 0.25 for x in a])
    assert diff.mean == pytest.approx(0.25) and diff.stderr == 0.0
    assert diff.ci_low == pytest.approx(0.25) and diff.ci_high == pytest.approx(0.25) and diff.measured


def test_pairing_removes_prompt_difficulty():
    """Prompt difficulty varies a lot, the model difference is a small constant plus noise: the paired SE is
    the SE of the differences (about 0.02/sqrt(n)), far below the unpaired one, and the 95% interval
    covers the true +0.03 while excluding 0."""
    rng = np.random.default_rng(0)
    n = 400
    difficulty = rng.uniform(0, 1, n)
    noise = rng.normal(0, 0.02, n)
    a, b = difficulty, difficulty + 0.03 + noise
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx(0.03 + noise.mean())
    assert diff.stderr == pytest.approx(noise.std(ddof=1) / math.sqrt(n))
    assert diff.ci_low < 0.03 < diff.ci_high and diff.measured
    # the percentile interval's half-width is close to 1.96 SE for a mean of 400 values
    assert (diff.ci_high - diff.ci_low) / 2 == pytest.approx(1.96 * diff.stderr, rel=0.15)
    unpaired = math.sqrt(stderr_over_prompts(a) ** 2 + stderr_over_prompts(b) ** 2)
    assert diff.stderr < unpaired / 10


def test_noise_only_difference_is_not_measured_and_is_reproducible():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 256).astype(float)
    b = a.copy()
    flip = rng.choice(256, 20, replace=False)
    b[flip] = 1 - b[flip]  # 20 flips each way at random: no systematic difference
    first, again = paired_difference(a, b), paired_difference(a, b)
    assert first == again  # fixed bootstrap seed
    assert first.ci_low < 0 < first.ci_high and not first.measured
    assert describe_difference(first).endswith("no measured difference")
    assert describe_difference(paired_difference([0, 0, 0], [1, 1, 1])) == "+100.0 ± 0.0 points (95% CI +100.0 to +100.0)"


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="equal-length"):
        paired_difference([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="at least one"):
        paired_difference([], [])


def _report(scores: list[list[float]], ids: list[str]):
    from slime_ext.evaluation import EvalReport

    records = [{"prompt_id": i, "row": n, "level": "L1", "scores": s, "lengths": [5] * len(s)}
               for n, (i, s) in enumerate(zip(ids, scores))]
    mean = sum(sum(s) / len(s) for s in scores) / len(scores)
    return EvalReport(len(scores), len(scores[0]), 1.0, {1: mean}, {1: mean}, None, mean, 0.0, 0.0, 5.0, None, 0.0,
                      None, {}, {}, records=records)


def test_study_difference_table_pairs_within_seeds(tmp_path):
    from slime_ext.evaluation import save_report
    from slime_ext.tools.study import difference_table

    ids = [f"p{i}" for i in range(40)]
    base = [[float(i % 2), float(i % 3 == 0)] for i in range(40)]
    better = [[1.0, 1.0] for _ in range(40)]
    paths = {}
    for arm, scores in (("GRPO", base), ("DUET", better), ("same", base)):
        paths[arm] = {seed: save_report(_report(scores, ids), tmp_path / arm / f"seed{seed}" / "eval_final.json")
                      for seed in (0, 1)}
    section = difference_table(tmp_path, paths, "GRPO")
    lines = section.splitlines()
    # base per-prompt means: odd i -> 0.5 + [i%3==0]/2, even -> [i%3==0]/2; mean over 40 = (20*0.5 + 14*0.5)/40
    expected = 100 * (1 - (20 * 0.5 + 14 * 0.5) / 40)
    duet = next(x for x in lines if x.startswith("| DUET"))
    assert duet.startswith(f"| DUET | {expected:+.1f} ± ") and "no measured" not in duet
    same = next(x for x in lines if x.startswith("| same"))
    assert same.startswith("| same | +0.0 ± 0.0 points") and "GRPO |" not in section
    assert "Difference to GRPO" in (tmp_path / "table.md").read_text()
    bad = {"GRPO": paths["GRPO"], "other": dict.fromkeys((0, 1), save_report(_report(base, [f"q{i}" for i in range(40)]),
                                                                             tmp_path / "q.json"))}
    with pytest.raises(ValueError, match="different prompts"):
        difference_table(tmp_path, bad, "GRPO")
    old_run = _report(base, ids)
    old_run.records = []  # a run evaluated before per-prompt records existed
    old = {"GRPO": {0: paths["GRPO"][0]}, "old": {0: save_report(old_run, tmp_path / "old.json")}}
    assert "| old | - (no per-prompt records in these runs) |" in difference_table(tmp_path, old, "GRPO")


def test_study_difference_table_pairs_by_seed_not_by_position(tmp_path):
    """An arm missing a seed is paired on the seeds both arms ran: its seed 1 with the reference's seed 1."""
    from slime_ext.evaluation import save_report
    from slime_ext.tools.study import difference_table

    ids = [f"p{i}" for i in range(8)]

    def evals(arm: str, seed_scores: dict[int, float]) -> dict:
        return {seed: save_report(_report([[x, x]] * 8, ids), tmp_path / arm / f"seed{seed}.json")
                for seed, x in seed_scores.items()}

    paths = {"GRPO": evals("GRPO", {0: 0.0, 1: 1.0}), "late": evals("late", {1: 0.5}), "other": evals("o", {2: 1.0})}
    section = difference_table(tmp_path, paths, "GRPO")
    assert "| late | -50.0 ± 0.0 points (95% CI -50.0 to -50.0) (seed 1; not paired: 0) |" in section  # not +50
    assert "| other | - (no seed in common with GRPO) |" in section


def test_study_difference_table_gives_each_seed_and_a_t_interval_across_seeds(tmp_path):
    """Seeds differing by +1, +2 and +3 points: mean +2.0, SE 1/sqrt(3) = 0.58, t(0.975, 2 df) = 4.303, so the
    interval across seeds is [-0.5, +4.5] (no measured difference) although each seed's pooled paired interval
    is narrow; one shared seed gets no interval across seeds."""
    from slime_ext.evaluation import save_report
    from slime_ext.tools.study import difference_table

    ids = [f"p{i}" for i in range(100)]

    def evals(arm: str, correct_by_seed: dict[int, int]) -> dict:
        return {seed: save_report(_report([[float(i < n)] * 2 for i in range(100)], ids),
                                  tmp_path / arm / f"seed{seed}.json") for seed, n in correct_by_seed.items()}

    paths = {"GRPO": evals("GRPO", {0: 0, 1: 0, 2: 0}), "TRL": evals("TRL", {0: 1, 1: 2, 2: 3}),
             "one": evals("one", {2: 5})}
    section = difference_table(tmp_path, paths, "GRPO")
    trl = next(x for x in section.splitlines() if x.startswith("| TRL"))
    assert trl.endswith("| s0 +1.0, s1 +2.0, s2 +3.0; +2.0 ± 0.6 [-0.5, +4.5] (no measured difference) |")
    one = next(x for x in section.splitlines() if x.startswith("| one"))
    assert one.endswith("(seed 2; not paired: 0, 1) | s2 +5.0; one seed, no interval across seeds |")


def test_study_difference_table_pairs_a_method_metric_in_its_own_unit(tmp_path):
    """`metric=`: per-prompt means of a records' method metric (None values skipped, a prompt undefined in either
    arm left out), in the metric's unit, not points. Think blocks 3 -> 4 on prompts 0-7 with prompt 8 undefined in
    the second arm and prompt 9 half undefined: difference exactly +1.0 over the 9 pairs; a run without the metric
    in its records says so."""
    from slime_ext.evaluation import save_report
    from slime_ext.tools.study import difference_table

    ids = [f"p{i}" for i in range(10)]

    def evals(arm: str, blocks: list[list]) -> dict:
        report = _report([[1.0, 1.0]] * 10, ids)
        for record, values in zip(report.records, blocks):
            record["response_metrics"] = {"think_blocks": values}
        return {0: save_report(report, tmp_path / arm / "seed0.json")}

    base = evals("SFT", [[3, 3]] * 9 + [[2, None]])
    shaped = evals("RL", [[4, 4]] * 8 + [[None, None], [3, 3]])
    plain = {0: save_report(_report([[1.0, 1.0]] * 10, ids), tmp_path / "plain.json")}
    section = difference_table(tmp_path, {"SFT": base, "RL": shaped, "old": plain}, "SFT", metric="think_blocks")
    assert "per-prompt mean of think_blocks over samples" in section
    assert "| RL | +1.00 ± 0.00 think_blocks (95% CI +1.00 to +1.00) | s0 +1.00; one seed, no interval across seeds |" in section
    assert "| old | - (no per-prompt think_blocks in these runs' records) | - |" in section
