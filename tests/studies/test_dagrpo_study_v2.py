"""scripts/dagrpo_study.py --task v2: every arm's keys accepted by its composed config, and the table from fake runs in
the real file formats (the tuned fixed reward chosen by its far-phase cloud rate, paired differences per prompt)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.studies.test_studies import study_script


def test_every_v2_arm_composes_and_validates(tmp_path):
    from slime_ext.config import load_config
    from slime_ext.tools.study import config_on_task

    study = study_script("dagrpo_study")
    runs = study.v2_runs(40, (0.2, 0.5))
    assert list(runs) == ["DA-GRPO", "local-only", "fixed assistance reward 0.2", "fixed assistance reward 0.5"]
    for arm, (config, overrides) in runs.items():
        cfg = load_config(config_on_task(config, "v2", tmp_path / study.slug(arm)), overrides).config
        near, far = cfg.dagrpo.phases
        assert (near.levels, far.levels, near.steps, far.steps) == (["V2", "V3", "V4"], ["V6", "V7", "V8"], 40, 40)
        assert near.tau == far.tau == 0.3 and cfg.train.steps == 80 and cfg.dagrpo.eval_sampled
        assert (cfg.grpo.kl_coef, cfg.train.lr, cfg.dagrpo.eta_lambda) == (0.2, 1e-4, 0.05)
        assert cfg.eval.n_prompts == 1026 and cfg.data.synthetic.train_level_weights is None
        assert cfg.rollout.max_response_len == 480 and cfg.sft.steps == 1200  # the v2 overlay's
        assert cfg.dagrpo.local_only == (arm == "local-only")
        if arm.startswith("fixed"):
            assert cfg.method == "collab_grpo" and cfg.dagrpo.hierarchical_reward == float(arm.split()[-1])


def fake_v2_run(root: Path, arm_slug: str, seed: int, far_rate: float, correct: list[float],
                asked: list[bool] | None = None, before: list[float] | None = None) -> None:
    """A finished v2 run: greedy correctness `correct` after the last phase (`before`, default the same, after the
    first), the sampled answers wrong, asking where `asked`."""
    run = root / f"{arm_slug}-seed{seed}" / f"{arm_slug}-20260101-000000"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"complete": True}))
    metrics = [{"step": k, "dagrpo/phase": float(k >= 4), "dagrpo/tau": 0.3,
                "dagrpo/cloud_rate": 0.1 if k < 4 else (0.9 if k < 7 else far_rate),
                f"dagrpo/cloud_rate/V{2 if k < 4 else 6}": 0.1} for k in range(8)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    for k, near_acc in ((0, 0.8), (1, 0.6)):
        phase = {"joint_accuracy": near_acc, "local_only_accuracy": 0.5, "cloud_rate": 0.2,
                 "sampled/cloud_rate": 0.4, "sampled/joint_accuracy": 0.55}
        if arm_slug != "local_only":  # the greedy evaluation's router baselines (none in the local-only arm)
            phase["cloud_alone_accuracy"] = 1.0
        (run / f"eval_after_phase_{k}.json").write_text(json.dumps({"near": phase, "far": dict(phase, joint_accuracy=0.3)}))
    asked = asked or [False] * len(correct)
    for k, scores in ((0, before or correct), (1, correct)):
        records = [{"phase": p, "decoding": d, "prompt_id": str(i), "level": f"V{2 + i % 2}",
                    "asked": asked[i] and d == "sampled", "correct": c if d == "greedy" else 0.0}
                   for p in ("near", "far") for d in ("greedy", "sampled") for i, c in enumerate(scores)]
        text = "".join(json.dumps(r) + "\n" for r in records)
        if seed == 1:  # as a run kept under --out/runs/ holds them
            (run / f"eval_after_phase_{k}.records.jsonl.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (run / f"eval_after_phase_{k}.records.jsonl").write_text(text)


def test_v2_table_picks_the_reward_nearest_dagrpo_and_pairs_prompts(tmp_path):
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    ones, zeros = [1.0] * 20, [0.0] * 20
    for seed in (0, 1):
        fake_v2_run(root, "local_only", seed, 0.0, zeros)
        fake_v2_run(root, "DA_GRPO", seed, 0.30, ones)
    fake_v2_run(root, "fixed_assistance_reward_0.2", 0, 0.05, ones)
    fake_v2_run(root, "fixed_assistance_reward_0.5", 0, 0.35, [1.0] * 10 + [0.0] * 10)  # nearest 0.30
    fake_v2_run(root, "fixed_assistance_reward_0.8", 0, 0.90, ones)
    fake_v2_run(root, "fixed_assistance_reward_0.5", 1, 0.25, [1.0] * 10 + [0.0] * 10)
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "1", "--phase-steps", "4", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    s = table["summary"]
    assert list(s) == ["DA-GRPO", "local-only", "fixed assistance reward (tuned)"]
    assert all(len(table["runs"][arm]) == 2 for arm in s)
    tuned = s["fixed assistance reward (tuned)"]
    # the last quarter of the far phase (steps 7 of 4-7): 0.35 and 0.25
    assert tuned["training cloud rate far (last quarter)"] == pytest.approx([0.30, 0.0707, 2], abs=1e-3)
    assert s["DA-GRPO"]["training cloud rate near (last quarter)"] == pytest.approx([0.1, 0.0, 2])
    assert s["DA-GRPO"]["forgetting (1st)"] == pytest.approx([0.25, 0.0, 2])  # (0.8 - 0.6) / 0.8
    assert s["DA-GRPO"]["sampled cloud rate far"] == pytest.approx([0.4, 0.0, 2])
    md = (tmp_path / "out" / "table.md").read_text()
    assert "tuned to DA-GRPO's far-phase cloud rate on seed 0: 0.5" in md
    # per prompt, both phases, greedy records only: local-only 0 vs 1 everywhere; the tuned arm loses half
    assert "| local-only | -100.0 ± 0.0 points" in md and "| fixed assistance reward (tuned) | -50.0 ±" in md
    assert (tmp_path / "out" / "cloud_rate_v2.png").stat().st_size > 0
    assert (tmp_path / "out" / "cloud_rate_by_level_v2.png").stat().st_size > 0
    assert study.moving_mean([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == [0.0, 0.5, 1.0, 1.5, 2.5, 3.5]


def test_the_asking_section_splits_asks_by_the_arms_own_greedy_correctness(tmp_path):
    """Seed 0 asks on 8 of the 10 prompts its greedy answer gets wrong and 1 of the 10 it gets right; seed 1 on 2
    of 10 and 1 of 10: pooled 10/20 = 0.5 against 2/20 = 0.1, +40 points; the arm that never asks has no row."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    correct = [0.0] * 10 + [1.0] * 10
    fake_v2_run(root, "DA_GRPO", 0, 0.3, correct, asked=[k < 8 for k in range(10)] + [k == 0 for k in range(10)])
    fake_v2_run(root, "DA_GRPO", 1, 0.3, correct, asked=[k < 2 for k in range(10)] + [k == 5 for k in range(10)])
    fake_v2_run(root, "local_only", 0, 0.0, correct)
    runs = [{"DA-GRPO": study.finished_run(root / "DA_GRPO-seed0"), "local-only": study.finished_run(
        root / "local_only-seed0")}, {"DA-GRPO": study.finished_run(root / "DA_GRPO-seed1")}]
    split = study.asks_by_competence([r["DA-GRPO"] for r in runs])
    assert set(split) == {"near", "far"}
    assert (sum(split["far"]["wrong"]), len(split["far"]["wrong"])) == (10, 20)
    assert (sum(split["far"]["right"]), len(split["far"]["right"])) == (2, 20)
    # levels alternate V2, V3 by prompt index: V2 holds asked prompts 0, 2, 4, 6, 10 (seed 0) and 0 (seed 1)
    assert sum(split["near"]["levels"]["V2"]) == 6 and len(split["near"]["levels"]["V2"]) == 20
    section = study.v2_asking(runs)
    rows = [line for line in section.splitlines() if line.startswith("| DA-GRPO |")]
    assert len(rows) == 2 and all("| 0.500 (20) | 0.100 (20) | +40.0 (95% CI +" in row for row in rows), rows
    # V2 and V3 both ask on 6 of their 20 prompts: the hardest level (V3) minus the easiest (V2) is 0
    assert all("| V2 0.300, V3 0.300 | +0.0 (95% CI -" in row for row in rows), rows
    assert "local-only" not in section.split("| --- |")[-1]
    assert all(row.count("no measured difference") == 1 for row in rows)  # the level spread's, not the +40


def test_only_starts_the_named_arms_and_tabulates_the_rest(tmp_path, monkeypatch):
    """`--only DA-GRPO` (a pilot of one arm) runs DA-GRPO alone; the finished local-only run is still read."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    fake_v2_run(root, "local_only", 0, 0.0, [0.0] * 4)
    started = []

    def fake_run_one(config, seed, parent, overrides, shared_sft_seed=None):
        started.append((parent.name, [o for o in overrides if o.startswith("train.steps")]))
        fake_v2_run(root, parent.name.rsplit("-seed", 1)[0], seed, 0.3, [1.0] * 4)
        return study.finished_run(parent)

    monkeypatch.setattr(study, "run_one", fake_run_one)
    monkeypatch.setattr(study, "keep_run_files", lambda *a, **k: None)
    assert study.main(["--task", "v2", "--seeds", "0", "--phase-steps", "80", "--only", "DA-GRPO", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    assert started == [("DA_GRPO-seed0", ["train.steps=160"])]
    summary = json.loads((tmp_path / "out" / "table.json").read_text())["summary"]
    assert list(summary) == ["DA-GRPO", "local-only"]
    assert "not run: fixed assistance reward 0.2 seed 0" in (tmp_path / "out" / "table.md").read_text()


def test_the_forgetting_section_pairs_each_arms_change_with_dagrpos(tmp_path):
    """DA-GRPO keeps all 20 near prompts it solved; local-only loses 10 of them (-50 points, -50 against DA-GRPO);
    the fixed reward gains 5 it had missed (+25, +25 against DA-GRPO); intervals from the bootstrap over prompts."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    fake_v2_run(root, "DA_GRPO", 0, 0.3, [1.0] * 20)
    fake_v2_run(root, "local_only", 0, 0.0, [1.0] * 10 + [0.0] * 10, before=[1.0] * 20)
    fake_v2_run(root, "fixed_assistance_reward_0.5", 0, 0.3, [1.0] * 15 + [0.0] * 5, before=[1.0] * 10 + [0.0] * 10)
    runs = [{"DA-GRPO": study.finished_run(root / "DA_GRPO-seed0"),
             "local-only": study.finished_run(root / "local_only-seed0"),
             "fixed assistance reward (tuned)": study.finished_run(root / "fixed_assistance_reward_0.5-seed0")}]
    assert sum(study.first_phase_change(runs[0]["local-only"]).values()) == -10
    rows = {line.split(" | ")[0].lstrip("| "): line for line in study.v2_forgetting(runs, [0]).splitlines()
            if line.startswith("| ") and "---" not in line and "arm |" not in line}
    assert rows["DA-GRPO"].startswith("| DA-GRPO | +0.0 ± 0.0 points") and rows["DA-GRPO"].endswith("| - |")
    assert "| -50.0 ± 11.5 points (95% CI" in rows["local-only"] and rows["local-only"].count("-50.0 ± 11.5") == 2
    assert rows["fixed assistance reward (tuned)"].count("+25.0 ± 9.9") == 2


def test_the_comparisons_give_each_seeds_difference_and_a_t_interval_across_seeds(tmp_path):
    """Local-only loses 10, 4 and 0 of 20 prompts DA-GRPO solves on seeds 0, 1, 2 (and had them all after the near
    phase): -50, -20, +0 points; mean -23.3, SE sd/sqrt(3) = 25.17/1.732 = 14.53, t(0.975, 2) = 4.303, half-width 62.5 gives
    [-85.8, +39.2] across seeds, while the pooled prompt-level difference is -23.3 over 60 prompts."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    runs = []
    for seed, lost in ((0, 10), (1, 4), (2, 0)):
        fake_v2_run(root, "DA_GRPO", seed, 0.3, [1.0] * 20)
        fake_v2_run(root, "local_only", seed, 0.0, [1.0] * (20 - lost) + [0.0] * lost, before=[1.0] * 20)
        runs.append({"DA-GRPO": study.finished_run(root / f"DA_GRPO-seed{seed}"),
                     "local-only": study.finished_run(root / f"local_only-seed{seed}")})
    across = "s0 -50.0, s1 -20.0, s2 +0.0; -23.3 ± 14.5 [-85.8, +39.2] (no measured difference)"
    difference = [line for line in study.v2_differences(runs, [0, 1, 2]).splitlines() if line.startswith("| local-only")]
    assert difference[0].startswith("| local-only | -23.3 ± ") and difference[0].endswith(f"| {across} |")
    forgetting = [line for line in study.v2_forgetting(runs, [0, 1, 2]).splitlines() if line.startswith("| local-only")]
    assert forgetting[0].count("-23.3 ± ") == 3 and forgetting[0].endswith(f"| {across} |")
    assert [line for line in study.v2_forgetting(runs, [0, 1, 2]).splitlines()
            if line.startswith("| DA-GRPO")][0].endswith("| - | - |")
    one_seed = [line for line in study.v2_differences(runs[:1], [5]).splitlines() if line.startswith("| local-only")]
    assert one_seed[0].endswith("| s5 -50.0; one seed, no interval across seeds |")


def test_a_run_of_other_phase_lengths_is_refused_not_tabulated(tmp_path):
    """Runs are found by folder name: a 40-step kept run read by an 80-step study would mix lengths in one table."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    fake_v2_run(root, "DA_GRPO", 0, 0.3, [1.0] * 4)
    run = study.finished_run(root / "DA_GRPO-seed0")
    (run / "config.yaml").write_text("dagrpo:\n  phases:\n  - {name: near, steps: 40}\n  - {name: far, steps: 40}\n")
    study.require_phase_steps(run, 40)
    with pytest.raises(SystemExit, match=r"trained \[40, 40\] RL steps, this study 80 \(--phase-steps\)"):
        study.main(["--task", "v2", "--report-only", "--seeds", "0", "--phase-steps", "80", "--runs", str(root),
                    "--out", str(tmp_path / "out")])


def test_routing_probabilities_fill_the_budget_by_priority_and_share_ties():
    from slime_ext.methods.dagrpo.routers import expected_routed_correctness, routing_probabilities

    assert routing_probabilities([3, 2, 2, 2, 1], 0.4).tolist() == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3, 0])
    assert routing_probabilities([0, 0, 0, 0], 0.5).tolist() == [0.5] * 4  # the random router
    assert routing_probabilities([1, 2], 0.0).tolist() == [0.0, 0.0]
    assert routing_probabilities([1, 2], 1.0).tolist() == [1.0, 1.0]
    assert expected_routed_correctness([1, 0], [1, 1], [0.25, 0.5]).tolist() == [1.0, 0.5]


def test_the_router_section_gives_each_router_the_arms_sampled_cloud_rate(tmp_path):
    """DA-GRPO asks (sampled) on 9 of 20 prompts, so every router sends 9 to the always-right cloud; its greedy answers
    are wrong on prompts 0-9 and right on 10-19, levels alternating V2, V3. Random: 0.45 + 0.55 x 0.5 = 0.725;
    hardest level first (V3, 10 prompts, 9 go): 0.9 on V3 plus its right answers' 0.1 (0.5 in all) and V2's 5 right,
    (9 + 0.5 + 5) / 20 = 0.725; oracle (the 10 wrong share 9): (9 + 10) / 20 = 0.95; level first over local-only's
    answers (all wrong): 9 / 20 = 0.45. The fake's sampled answers are all scored wrong (arm 0.000)."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    correct = [0.0] * 10 + [1.0] * 10
    fake_v2_run(root, "DA_GRPO", 0, 0.3, correct, asked=[k < 8 for k in range(10)] + [k == 0 for k in range(10)])
    fake_v2_run(root, "local_only", 0, 0.0, [0.0] * 20)
    runs = [{"DA-GRPO": study.finished_run(root / "DA_GRPO-seed0"),
             "local-only": study.finished_run(root / "local_only-seed0")}]
    rows = [line for line in study.v2_routers(runs).splitlines() if line.startswith("| DA-GRPO | far |")]
    expected = [("random (own greedy)", 0.725), ("hardest level first (own greedy)", 0.725),
                ("greedy-wrong first, oracle (own greedy)", 0.95), ("hardest level first (local-only's greedy)", 0.45)]
    assert len(rows) == 4
    for row, (label, accuracy) in zip(rows, expected):
        assert f"| 0.450 | 0.000 | {label} | {accuracy:.3f} | {-100 * accuracy:+.1f} ±" in row, row
    assert "local-only |" not in study.v2_routers(runs).split("| --- |")[-1]  # it never asks: no budget to give


def test_the_router_section_names_a_run_without_the_clouds_accuracy(tmp_path):
    study = study_script("dagrpo_study")
    fake_v2_run(tmp_path, "DA_GRPO", 0, 0.3, [0.0, 1.0], asked=[True, False])
    run = study.finished_run(tmp_path / "DA_GRPO-seed0")
    summary = json.loads((run / "eval_after_phase_1.json").read_text())
    del summary["far"]["cloud_alone_accuracy"]
    (run / "eval_after_phase_1.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"eval_after_phase_1.json: phase 'far' has no cloud_alone_accuracy"):
        study.v2_routers([{"DA-GRPO": run}])


def fake_ask_probability(run: Path, asks: list[list[bool]], greedy: list[float]) -> None:
    """A run's per-prompt ask probability files, both phases alike; levels alternate V2, V3 by prompt index."""
    (run / "eval_ask_probability.json").write_text("{}")
    records = [{"phase": phase, "prompt_id": str(i), "level": f"V{2 + i % 2}", "greedy_correct": g,
                "greedy_asked": False, "asks": a, "correct": [0.0] * len(a)}
               for phase in ("near", "far") for i, (a, g) in enumerate(zip(asks, greedy))]
    (run / "eval_ask_probability.records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_ask_probability_section_pools_seeds_and_compares_prompts_within_a_seed(tmp_path):
    """Seed 0 asks always where its greedy answer is wrong (prompts 0, 1) and never where right: AUC 1; seed 1 asks
    half the time on every prompt: 0.5. Within seeds (4 + 4 pairs) the AUC is 0.75, where pairing across seeds would
    give 14 / 16; within level and seed also 0.75. Mean p (2 + 0 + 4 x 0.5) / 8 = 0.5; every level of either seed
    averages 0.5, so by level alone 2 samples give p = 0 and p = 1 a quarter of the time each."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    greedy = [0.0, 0.0, 1.0, 1.0]
    for seed, asks in ((0, [[True, True], [True, True], [False, False], [False, False]]),
                       (1, [[True, False]] * 4)):
        fake_v2_run(root, "DA_GRPO", seed, 0.3, greedy)
        fake_ask_probability(study.finished_run(root / f"DA_GRPO-seed{seed}"), asks, greedy)
    fake_v2_run(root, "local_only", 0, 0.0, greedy)
    runs = [{"DA-GRPO": study.finished_run(root / f"DA_GRPO-seed{s}")} for s in (0, 1)]
    runs[0]["local-only"] = study.finished_run(root / "local_only-seed0")
    rows = [line for line in study.v2_ask_probability(runs).splitlines() if line.startswith("| DA-GRPO |")]
    assert len(rows) == 2, rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2:6] == ["8 x 2", "0.500", "0.250 / 0.250 / 0.250 (0.250 / 0.250)",
                              "0.750 (4) / 0.250 (4)"], cells
        assert cells[6].startswith("+50.0 [") and cells[7].startswith("0.750 [") and cells[8].startswith("0.750 [")
        assert cells[9] == "V2 0.500, V3 0.500"
    assert "(no run has it yet" in study.v2_ask_probability([{"local-only": runs[0]["local-only"]}])


def test_the_study_measures_the_ask_probability_of_the_asking_arms_only(tmp_path, monkeypatch):
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    measured = []

    def fake_run_one(config, seed, parent, overrides, shared_sft_seed=None):
        if study.finished_run(parent) is None:  # as run_one: a finished run is not run again
            fake_v2_run(root, parent.name.rsplit("-seed", 1)[0], seed, 0.3, [1.0] * 4)
        return study.finished_run(parent)

    monkeypatch.setattr(study, "run_one", fake_run_one)
    monkeypatch.setattr(study, "keep_run_files", lambda *a, **k: None)
    monkeypatch.setattr(study, "ask_probability", lambda run, samples, kept: measured.append((run.parent.name, samples)))
    args = ["--task", "v2", "--seeds", "0", "--phase-steps", "4", "--only", "DA-GRPO", "local-only", "--runs", str(root),
            "--out", str(tmp_path / "out")]
    assert study.main(args) == 0
    assert measured == [("DA_GRPO-seed0", 8)]
    measured.clear()
    assert study.main([*args, "--ask-samples", "0"]) == 0 and measured == []
    assert study.main([*args, "--report-only"]) == 0 and measured == []


def test_dagrpo_and_its_warm_start_are_measured_before_the_next_arm_runs_and_only_the_tuned_sweep_point(tmp_path,
                                                                                                          monkeypatch):
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    far_rates = {"DA_GRPO": 0.3, "fixed_assistance_reward_0.2": 0.1, "fixed_assistance_reward_0.5": 0.35}
    events = []

    def fake_run_one(config, seed, parent, overrides, shared_sft_seed=None):
        arm = parent.name.rsplit("-seed", 1)[0]
        events.append(("run", arm))
        fake_v2_run(root, arm, seed, far_rates.get(arm, 0.0), [1.0] * 4)
        return study.finished_run(parent)

    monkeypatch.setattr(study, "run_one", fake_run_one)
    monkeypatch.setattr(study, "keep_run_files", lambda *a, **k: None)
    monkeypatch.setattr(study, "ask_probability", lambda run, samples, kept: events.append(("ask", run.parent.name)))
    monkeypatch.setattr(study, "warm_start_asks", lambda run, samples, folder, kept: events.append(("warm", folder.name)))
    assert study.main(["--task", "v2", "--seeds", "0", "--phase-steps", "4", "--assist-sweep", "0.2", "0.5",
                       "--runs", str(root), "--out", str(tmp_path / "out")]) == 0
    assert events == [("run", "DA_GRPO"), ("ask", "DA_GRPO-seed0"), ("warm", "warm_start-seed0"), ("run", "local_only"),
                      ("run", "fixed_assistance_reward_0.2"), ("run", "fixed_assistance_reward_0.5"),
                      ("ask", "fixed_assistance_reward_0.5-seed0")]


def test_a_kept_copy_without_its_checkpoint_is_not_measured(tmp_path, capsys):
    study = study_script("dagrpo_study")
    fake_v2_run(tmp_path, "DA_GRPO", 0, 0.3, [1.0] * 4)
    run = study.finished_run(tmp_path / "DA_GRPO-seed0")
    study.ask_probability(run, 8, tmp_path / "kept")
    assert "no checkpoint here (a kept copy)" in capsys.readouterr().out
    assert not (run / "eval_ask_probability.json").exists()


def test_the_warm_start_rows_pair_each_arm_with_its_seeds_warm_start(tmp_path):
    """The warm start answers none of the 20 prompts per phase greedily, DA-GRPO the first 10 (+50 points), local-only
    all 20 (+100); the warm start's ask probability gets its own row in the ask table."""
    study = study_script("dagrpo_study")
    root = tmp_path / "runs"
    fake_v2_run(root, "DA_GRPO", 0, 0.3, [1.0] * 10 + [0.0] * 10)
    fake_v2_run(root, "local_only", 0, 0.0, [1.0] * 20)
    warm = root / "warm_start-seed0"
    warm.mkdir()
    fake_ask_probability(warm, [[True, False]] * 20, [0.0] * 20)
    runs = [{"DA-GRPO": study.finished_run(root / "DA_GRPO-seed0"), "local-only": study.finished_run(root / "local_only-seed0")}]
    section = study.v2_against_warm_start(runs, [warm])
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in section.splitlines()
            if line.startswith("| DA-GRPO") or line.startswith("| local-only")}
    assert set(rows) == {("DA-GRPO", "near"), ("DA-GRPO", "far"), ("local-only", "near"), ("local-only", "far")}
    assert "| 0.000 | 0.500 | +50.0 ± 11.5 points" in rows[("DA-GRPO", "far")]
    assert "| 0.000 | 1.000 | +100.0 ± 0.0 points" in rows[("local-only", "near")]
    asks = [line for line in study.v2_ask_probability(runs, [warm]).splitlines() if line.startswith("| warm start")]
    assert len(asks) == 2 and all("| 20 x 2 | 0.500 |" in line for line in asks)
    assert "(no warm start evaluated yet" in study.v2_against_warm_start(runs, [None])


def test_the_warm_start_is_evaluated_once_per_seed_where_it_is_on_the_machine(tmp_path, monkeypatch, capsys):
    study = study_script("dagrpo_study")
    fake_v2_run(tmp_path, "DA_GRPO", 0, 0.3, [1.0] * 4)
    run = study.finished_run(tmp_path / "DA_GRPO-seed0")
    (run / "summary.json").write_text(json.dumps({"complete": True, "stages": {"sft": {"warm_start": str(tmp_path / "ws")}}}))
    calls = []

    def fake_eval(checkpoint, config, report, *args, then=()):
        calls.append((Path(checkpoint).name, config.name, report.name, args))
        fake_ask_probability(report.parent, [[True]] * 4, [1.0] * 4)
        return report

    monkeypatch.setattr(study, "eval_checkpoint", fake_eval)
    study.warm_start_asks(run, 8, tmp_path / "w", tmp_path / "kept")
    assert "not on this machine" in capsys.readouterr().out and calls == []
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "config.json").write_text("{}")
    study.warm_start_asks(run, 8, tmp_path / "w", tmp_path / "kept")
    assert calls == [("ws", "config.yaml", "eval.json", ("--dagrpo-ask-samples", "8", "--skip-eval"))]
    assert (tmp_path / "kept" / "eval_ask_probability.json").exists()
    assert (tmp_path / "kept" / "eval_ask_probability.records.jsonl.gz").exists()
    study.warm_start_asks(run, 8, tmp_path / "w", tmp_path / "kept")  # once
    assert len(calls) == 1
    # evaluated by hand before the study kept it: kept now, not evaluated again
    study.warm_start_asks(run, 8, tmp_path / "w", tmp_path / "kept2")
    assert len(calls) == 1 and (tmp_path / "kept2" / "eval_ask_probability.records.jsonl.gz").exists()


def test_an_asking_runs_earlier_measurement_is_kept_not_repeated(tmp_path, monkeypatch):
    study = study_script("dagrpo_study")
    fake_v2_run(tmp_path, "DA_GRPO", 0, 0.3, [1.0] * 4)
    run = study.finished_run(tmp_path / "DA_GRPO-seed0")
    fake_ask_probability(run, [[True]] * 4, [1.0] * 4)
    monkeypatch.setattr(study, "eval_checkpoint", lambda *a, **k: pytest.fail("measured again"))
    study.ask_probability(run, 8, tmp_path / "kept")
    assert (tmp_path / "kept" / "eval_ask_probability.json").exists() and (tmp_path / "kept" / "metrics.jsonl").exists()
