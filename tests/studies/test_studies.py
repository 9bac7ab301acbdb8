"""slime_ext.studies: the intervals and tables every study's numbers go through, against hand-computed values."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from slime_ext.studies import (ci_text, min_detectable_difference, paired_over_prompts, per_level_table,
                               per_prompt_scores, read_records, t_interval)
from slime_ext.tools.study import across_seeds_cell
from tests.conftest import CONFIGS, fake_our_subprocesses


def test_t_interval_on_three_seeds():
    r = t_interval([1.0, 2.0, 3.0])  # sd 1, se 1/sqrt(3), t(0.975, 2) = 4.302653
    assert r["mean"] == 2.0 and r["n"] == 3
    assert r["se"] == pytest.approx(0.5773503)
    assert r["ci95"] == pytest.approx([2 - 2.484138, 2 + 2.484138], abs=1e-5)
    assert t_interval([0.4]) == {"mean": 0.4, "se": None, "ci95": None, "n": 1}
    with pytest.raises(ValueError):
        t_interval([])


def test_paired_over_prompts_uses_only_shared_prompts():
    a = {"p1": 1.0, "p2": 0.5, "p3": 0.0}
    b = {"p1": 0.5, "p2": 0.5, "p3": 0.5, "p4": 1.0}
    r = paired_over_prompts(a, b)  # differences 0.5, 0, -0.5: mean 0, sd 0.5
    assert r["n_prompts"] == 3 and r["diff"] == pytest.approx(0.0)
    assert r["se"] == pytest.approx(0.5 / 3 ** 0.5)
    assert r["ci95"] == pytest.approx([-1.96 * 0.2886751, 1.96 * 0.2886751])
    with pytest.raises(ValueError, match="2 shared prompts"):
        paired_over_prompts({"p1": 1.0}, {"p1": 0.0})


def test_min_detectable_difference_of_two_three_seed_arms():
    # t(0.975, 4) = 2.776445; sd 2; sqrt(2/3) = 0.8164966
    assert min_detectable_difference(2.0, 3) == pytest.approx(2.776445 * 2 * 0.8164966, rel=1e-6)
    with pytest.raises(ValueError):
        min_detectable_difference(1.0, 1)


def test_across_seeds_cell_gives_each_seed_and_a_t_interval_in_the_metric_unit():
    # seeds 0.52 and 0.40: mean 0.46, sd 0.0849, se 0.06, t(0.975, 1) = 12.706 -> +-0.762
    assert (across_seeds_cell({0: 0.52, 1: 0.40}, 1.0, 2)
            == "s0 +0.52, s1 +0.40; +0.46 ± 0.06 [-0.30, +1.22] (no measured difference)")
    # points: sd 0.4 over three seeds, se 0.231, t(0.975, 2) = 4.303 -> +-0.99
    assert across_seeds_cell({0: 0.012, 1: 0.004, 2: 0.008}) == "s0 +1.2, s1 +0.4, s2 +0.8; +0.8 ± 0.2 [-0.2, +1.8] (no measured difference)"
    assert across_seeds_cell({3: 0.5}, 1.0, 2) == "s3 +0.50; one seed, no interval across seeds"


def test_ci_text_says_when_the_interval_holds_zero():
    assert ci_text({"mean": 0.02, "se": 0.005, "ci95": [0.01, 0.03]}) == "+2.0 ± 0.5 [+1.0, +3.0]"
    assert ci_text({"diff": 0.01, "se": 0.01, "ci95": [-0.01, 0.03]}).endswith("(no measured difference)")
    assert ci_text({"mean": -0.031, "se": None, "ci95": None}) == "-3.1 (one seed)"
    assert ci_text({"mean": 0.52, "se": 0.021, "ci95": [0.47, 0.56]}, 1.0, digits=2) == "+0.52 ± 0.02 [+0.47, +0.56]"


def test_per_level_table_from_gzipped_records(tmp_path):
    recs = [
        {"prompt_id": "a", "level": "V10", "scores": [1, 0], "lengths": [300, 320], "finish_reasons": ["stop", "length"],
         "greedy_score": 0},
        {"prompt_id": "b", "level": "V2", "scores": [1, 1], "lengths": [50, 60], "finish_reasons": ["stop", "stop"],
         "greedy_score": 1},
        {"prompt_id": "c", "level": "V2", "scores": [0, 1], "lengths": [40, 70], "finish_reasons": ["stop", "stop"],
         "greedy_score": 0},
    ]
    path = tmp_path / "eval_final.records.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    rows = read_records(path)
    assert per_prompt_scores(rows) == {"a": 0.5, "b": 1.0, "c": 0.5}
    assert per_prompt_scores(rows, level="V2") == {"b": 1.0, "c": 0.5}
    v2, v10 = per_level_table(rows)  # V2 sorts before V10
    assert (v2["level"], v2["n_prompts"], v2["mean@1"], v2["pass@k"], v2["greedy"]) == ("V2", 2, 0.75, 1.0, 0.5)
    assert v2["mean@1_se"] == pytest.approx(0.25)  # per-prompt 1.0 and 0.5: sd 0.3536 / sqrt 2
    assert (v2["mean_len"], v2["max_len"], v2["truncated"]) == (55.0, 70, 0.0)
    assert (v10["level"], v10["mean@1"], v10["mean@1_se"], v10["truncated"]) == ("V10", 0.5, None, 0.5)


def test_keep_run_files_copies_small_files_and_gzips_records(tmp_path):
    from slime_ext.studies import keep_run_files, read_metrics

    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    (run / "hf" / "model.safetensors").write_bytes(b"x" * 10)
    (run / "config.yaml").write_text("a: 1\n")
    (run / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5}\n\n{"step": 1, "reward/mean": 0.75}\n')
    (run / "eval_final.records.jsonl").write_text('{"prompt_id": "p", "scores": [1, 0]}\n')
    (run / "eval_step20.json").write_text('{"mean@4": 0.5}')  # between steps (eval.every)
    (run / "eval_other.json").write_text('{}')  # not a report the runner writes: not kept
    keep_run_files(run, tmp_path / "kept")
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == ["config.yaml", "eval_final.records.jsonl.gz", "eval_step20.json", "metrics.jsonl"]  # no hf/
    assert read_records(tmp_path / "kept" / "eval_final.records.jsonl.gz") == [{"prompt_id": "p", "scores": [1, 0]}]
    assert [m["reward/mean"] for m in read_metrics(tmp_path / "kept")] == [0.5, 0.75]
    gz = tmp_path / "kept" / "eval_final.records.jsonl.gz"
    first = gz.read_bytes()
    (tmp_path / "kept" / "eval_sft.records.jsonl.gz").write_bytes(b"not gzip")  # unreadable: written again
    (run / "eval_sft.records.jsonl").write_text('{"prompt_id": "q", "scores": [0]}\n')
    time.sleep(1.1)  # the gzip header holds whole seconds: a rewrite now would change the bytes
    keep_run_files(run, tmp_path / "kept")
    assert gz.read_bytes() == first  # unchanged records are not re-stamped (a study report would show them as changed)
    assert read_records(tmp_path / "kept" / "eval_sft.records.jsonl.gz") == [{"prompt_id": "q", "scores": [0]}]
    (run / "eval_final.records.jsonl").write_text('{"prompt_id": "p", "scores": [1, 1]}\n')
    keep_run_files(run, tmp_path / "kept")
    assert read_records(gz) == [{"prompt_id": "p", "scores": [1, 1]}]  # a changed record is written


def study_script(name: str):
    """`scripts/<name>.py` imported as a module (the study scripts are not a package)."""
    import importlib.util

    from tests.conftest import REPO
    import sys

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


def _duet_study():
    return study_script("duet_study")


def test_every_duet_study_arm_on_v2_is_a_valid_config_of_its_method_on_the_v2_pool(tmp_path):
    """The composed config (arm's config + configs/tasks/v2.yaml) and the task's keys load for every arm: a key the
    arm's method does not have would be rejected here instead of hours into the study."""
    from slime_ext.config import load_config
    from slime_ext.tools.study import config_on_task

    study = _duet_study()
    arms = {**study.ARMS, **study.TASKS["v2"]["extra_arms"]}
    assert len(arms) == 9
    for arm, (config, extra) in arms.items():
        folder = tmp_path / arm.replace(" ", "_").replace("%", "pct")
        composed = config_on_task(config, "v2", folder)
        cfg = load_config(composed, study.arm_overrides("v2", arm, config, [*study.COMMON, *extra])).config
        assert cfg.method == config.removesuffix(".yaml"), arm
        assert cfg.eval.warm_start is (arm == "GRPO full")  # the seed's warm start: evaluated in one arm
        assert cfg.data.synthetic.train_levels == [f"V{k}" for k in range(2, 11)] and cfg.eval.n_prompts == 1026
        assert cfg.rollout.prompt_pool == 256 and cfg.rollout.max_response_len == 480
        if cfg.method == "duet":
            assert cfg.duet.grace == 48
        if cfg.method == "dapo":
            assert cfg.dapo.overlong_buffer == 96
    n_min = load_config(config_on_task("duet.yaml", "v2", tmp_path / "n_min"),
                        study.arm_overrides("v2", "DUET 50% n_min 2", "duet.yaml", arms["DUET 50% n_min 2"][1])).config
    assert (n_min.duet.n_min, n_min.duet.budget_fraction) == (2, 0.5)
    for arm, (budget, steps) in {"DUET 50% equal time": (0.5, 74), "DUET 25% equal time": (0.25, 117)}.items():
        long = load_config(config_on_task("duet.yaml", "v2", tmp_path / arm.replace(" ", "_").replace("%", "pct")),
                           study.arm_overrides("v2", arm, "duet.yaml", arms[arm][1])).config
        assert (long.duet.budget_fraction, long.train.steps, long.train.lr_warmup_steps,
                long.train.lr_decay_style) == (budget, steps, 0, "constant"), arm  # its first 40 steps: the 40-step arm's
    # v1 runs each config as it is (the committed study)
    assert config_on_task("duet.yaml", "v1", tmp_path / "v1") == CONFIGS / "duet.yaml"
    with pytest.raises(ValueError, match="unknown task 'v3'"):
        config_on_task("duet.yaml", "v3", tmp_path)


def test_duet_study_time_to_target_uses_the_full_grpo_arms_final_reward(tmp_path):
    """v2's target: full GRPO's training reward over its last 5 steps (0.6 here); an arm whose trailing 5-step reward
    first reaches it at step 7 took 7 steps and the seconds of those 7."""
    study = _duet_study()

    def run(name, rewards, seconds):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": i, "reward/mean": r, "time/step": seconds, "rollout/generated_tokens": 100}) + "\n"
            for i, r in enumerate(rewards)))
        (folder / "eval_final.json").write_text(json.dumps({"mean@4": 0.3, "pass@4": 0.5, "greedy": 0.35}))
        return folder

    full = run("full", [0.4] * 5 + [0.6] * 5, 10.0)
    assert study.final_reward(full) == pytest.approx(0.6)
    duet = run("duet", [0.4] * 4 + [0.8] * 6, 4.0)  # trailing means: ..., step 6 (0.4 x 2, 0.8 x 3) = 0.64
    row = study.row_of(duet, study.final_reward(full))
    assert (row["steps_to_target"], row["seconds_to_target"]) == (7.0, 28.0)
    assert row["seconds_per_step"] == 4.0 and row["tokens_per_step"] == 100 and row["greedy"] == 0.35
    assert row["rl_seconds"] == 40.0  # 10 steps x 4 s: what the equal-time arms match to full GRPO's
    assert "rollout_ms_per_token" not in row  # these metrics carry no phase times
    (duet / "metrics.jsonl").write_text("".join(json.dumps(  # 3 s rollout for 100 then 300 tokens, 1 s train for 50
        {"reward/mean": 0.5, "time/step": 4.0, "time/rollout": 3.0, "time/train": 1.0,
         "rollout/generated_tokens": n, "train/tokens": 50}) + "\n" for n in (100, 300)))
    row = study.row_of(duet, 0.6)  # token-weighted: 6 s over 400 tokens, 2 s over 100
    assert (row["rollout_ms_per_token"], row["train_ms_per_token"]) == (15.0, 20.0)
    (duet / "eval_final.json").write_text(json.dumps({"mean@4": 0.3, "pass@4": 0.5, "greedy": None}))  # eval.greedy off
    assert "greedy" not in study.row_of(duet, 0.6)


def test_a_study_run_stopped_part_way_resumes_from_its_checkpoint_and_a_finished_one_is_skipped(tmp_path, monkeypatch):
    from slime_ext.tools import study

    def run_dir(parent, name: str, complete: bool, checkpoint: bool):
        run = parent / name
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"complete": complete}))
        if checkpoint:
            (run / "checkpoints").mkdir()
            (run / "checkpoints" / "latest").write_text("iter_0000012")
        return run

    calls: list[list[str]] = []

    def driver(cmd, **_):  # the driver completes the run it resumes, or a new one in run.output_dir
        calls.append(cmd[3:])
        resumed = [a.split("=", 1)[1] for a in cmd if a.startswith("resume=")]
        if resumed:
            (Path(resumed[0]) / "summary.json").write_text(json.dumps({"complete": True}))
        else:
            output = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("run.output_dir=")))
            run_dir(output, "grpo-20261127-170000", True, True)

    fake_our_subprocesses(monkeypatch, driver)
    killed = run_dir(tmp_path / "a", "grpo-20261127-150000", complete=False, checkpoint=True)  # at step 12
    run_dir(tmp_path / "a", "grpo-20261127-160000", complete=False, checkpoint=False)  # before its first checkpoint
    assert study.run_one("grpo.yaml", 0, tmp_path / "a", ["train.steps=40"]) == killed
    assert calls == [[f"resume={killed}"]]
    assert study.run_one("grpo.yaml", 0, tmp_path / "a", ["train.steps=40"]) == killed and len(calls) == 1  # skipped

    run_dir(tmp_path / "b", "grpo-20261127-160000", complete=False, checkpoint=False)  # nothing to resume: a new run
    new = study.run_one("grpo.yaml", 3, tmp_path / "b", ["train.steps=40"], shared_sft_seed=3)
    assert new == tmp_path / "b" / "grpo-20261127-170000"
    assert calls[1][1:] == ["run.seed=3", "sft.seed=3", f"run.output_dir={tmp_path / 'b'}", "train.steps=40"]

    # folders relative to the caller's directory (`--runs runs/pilot`), while the driver runs in the repository root:
    # both the composed config and the output folder reach it as absolute paths (a relative one named configs/runs/...)
    monkeypatch.chdir(tmp_path)
    composed = study.config_on_task("grpo.yaml", "v2", Path("rel") / "c")
    assert composed == tmp_path / "rel" / "c" / "grpo.v2.yaml" and composed.exists()
    study.run_one(composed, 0, Path("rel") / "c", [])
    assert calls[2][:3] == [str(composed), "run.seed=0", "sft.seed=0"]
    assert calls[2][3] == f"run.output_dir={tmp_path / 'rel' / 'c'}"


def _report(path, scores_per_prompt: list[list[float]], temperature: float = 1.0) -> None:
    """An eval JSON with its per-prompt records (4 samples a prompt; no greedy)."""
    from slime_ext.evaluation import EvalReport, save_report

    flat = [s for row in scores_per_prompt for s in row]
    mean = sum(flat) / len(flat)
    save_report(EvalReport(n_prompts=len(scores_per_prompt), n_samples=4, temperature=temperature,
                           mean_at_k={4: mean}, pass_at_k={4: sum(max(r) for r in scores_per_prompt) / len(scores_per_prompt)},
                           greedy=None, mean_score=mean, mean_score_stderr=0.0, mean_at_1_stderr=0.0,
                           mean_response_len=10.0, greedy_mean_response_len=None, truncation_rate=0.0,
                           greedy_truncation_rate=None, reasons={}, greedy_reasons={},
                           records=[{"prompt_id": f"p{i}", "scores": row} for i, row in enumerate(scores_per_prompt)]),
                path)


def test_duet_study_v2_table_holds_each_seeds_warm_start_and_its_sharpening_paired_with_the_arms(tmp_path, monkeypatch):
    """On v2 the table carries the noise floor's baselines: the warm start at T = 1 (from the full GRPO arm) and at
    T = 0.4 (evaluated once per seed, skipped when done), each paired prompt by prompt with full GRPO."""
    study = _duet_study()
    warm, trained, cooled = [[0.0, 0.0, 0.0, 1.0]] * 8, [[0.0, 0.0, 1.0, 1.0]] * 8, [[0.0, 1.0, 1.0, 1.0]] * 8
    metrics = "".join(json.dumps({"step": i, "reward/mean": 0.5, "time/step": 2.0, "rollout/generated_tokens": 100,
                                  "duet/n_mean": 8, "duet/n_min": 8, "duet/n_max": 8, "duet/n_mean/V2": 9,
                                  "duet/n_mean/V10": 7}) + "\n" for i in range(3))

    def fake_run(config, seed, parent, overrides, shared_sft_seed=0):
        run = parent / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text(metrics)
        _report(run / "eval_final.json", trained)
        (run / "config.yaml").write_text("method: grpo\n")
        (run / "summary.json").write_text(json.dumps({"complete": True, "stages": {"sft": {"warm_start": "WS"}}}))
        if "eval.warm_start=false" not in overrides:
            _report(run / "eval_warm_start.json", warm)
        return run

    evaluated = []

    def fake_eval(cmd, **_):
        evaluated.append(cmd[3:])
        _report(Path(cmd[cmd.index("--out") + 1]), cooled, temperature=0.4)

    monkeypatch.setattr(study, "run_one", fake_run)
    fake_our_subprocesses(monkeypatch, fake_eval)
    out = tmp_path / "out"
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    run = tmp_path / "runs" / "GRPO_full-seed0" / "run"
    assert evaluated == [["WS", "--config", str(run / "config.yaml"), "eval.temperature=0.4", "eval.greedy=false",
                          "--out", str(tmp_path / "runs" / "sharpening_T0.4-seed0" / "eval_sharpening.json")]]
    summary = json.loads((out / "table.json").read_text())["summary"]
    assert summary["warm start, no RL (T = 1)"]["mean@4"][0] == 0.25
    assert summary["warm start, no RL, T = 0.4 (sharpening)"]["mean@4"][0] == 0.75
    assert summary["DUET 50%"]["mean@4"][0] == 0.5
    table = (out / "table.md").read_text()
    # paired with full GRPO over the 8 prompts: -25 and +25 points, no spread
    assert "| warm start, no RL (T = 1) | -25.0" in table and "| warm start, no RL, T = 0.4 (sharpening) | +25.0" in table
    # DUET 50% at the same tokens as uniform half rollouts: a second difference table against that arm
    assert "## Difference to GRPO x0.5 rollouts" in table and "| DUET 50% n_min 2 | +0.0" in table.split("x0.5 rollouts (held")[1]
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert len(evaluated) == 1  # the seed's sharpening evaluation is kept
    assert all((out / f).stat().st_size > 1000 for f in ("duet_controller.png", "duet_allocation_by_level.png"))
    # every run and the sharpening evaluation land under --out with their records gzipped
    kept = out / "runs"
    assert (kept / "GRPO_full-seed0" / "eval_warm_start.records.jsonl.gz").is_file()
    assert (kept / "DUET_50pct-seed0" / "metrics.jsonl").read_text() == metrics
    assert read_records(kept / "sharpening_T0.4-seed0" / "eval_sharpening.records.jsonl.gz")[0]["scores"] == cooled[0]
    # --report-only rebuilds the same table from the kept files alone (a machine that holds only results/)
    import shutil

    shutil.rmtree(tmp_path / "runs")
    before = json.loads((out / "table.json").read_text())["summary"]
    monkeypatch.setattr(study, "run_one", lambda *a, **k: pytest.fail("--report-only started a run"))
    assert study.main(["--seeds", "0", "--out", str(out), "--report-only"]) == 0
    assert json.loads((out / "table.json").read_text())["summary"] == before and len(evaluated) == 1
    assert "| warm start, no RL, T = 0.4 (sharpening) | +25.0" in (out / "table.md").read_text()
    # a study resumed on a machine without the run folders reads the kept runs instead of running them again
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "elsewhere"), "--out", str(out)]) == 0
    assert json.loads((out / "table.json").read_text())["summary"] == before and len(evaluated) == 1
    with pytest.raises(SystemExit, match="takes no overrides"):
        study.main(["--seeds", "0", "--out", str(out), "--report-only", "duet.n_min=2"])
    shutil.rmtree(kept / "DAPO-seed0")
    with pytest.raises(SystemExit, match=r"DAPO-seed0/summary.json is missing"):
        study.main(["--seeds", "0", "--out", str(out), "--report-only"])
    # --arms: those arms and full GRPO, the reference
    assert study.main(["--seeds", "0", "--out", str(out), "--report-only", "--arms", "DUET 50%"]) == 0
    assert sorted(json.loads((out / "table.json").read_text())["runs"]) == [
        "DUET 50%", "GRPO full", "warm start, no RL (T = 1)", "warm start, no RL, T = 0.4 (sharpening)"]
    with pytest.raises(SystemExit, match=r"--arms: unknown arm\(s\) \['DUET 60%'\]"):
        study.main(["--seeds", "0", "--out", str(out), "--report-only", "--arms", "DUET 60%"])


def test_summarise_skips_what_an_arm_never_reached_and_the_table_names_the_seeds_behind_a_cell(tmp_path):
    """A time-to-target an arm never reached is NaN on that seed: mean and std over the seeds that reached it, NaN
    with 0 seeds where none did (statistics.stdev raised on NaN), and the table says n where it is not every seed and
    shows no "± 0.000" where one seed stands behind a cell."""
    from slime_ext.tools.study import summarise, write_table

    nan = float("nan")
    summary = summarise({"a": [{"x": 1.0, "t": nan}, {"x": 3.0, "t": 5.0}], "b": [{"x": 2.0, "t": nan}, {"x": 2.0, "t": nan}]})
    assert summary["a"]["x"] == pytest.approx((2.0, 2 ** 0.5, 2)) and summary["a"]["t"] == (5.0, 0.0, 1)
    assert summary["b"]["t"][2] == 0 and summary["b"]["t"][0] != summary["b"]["t"][0]
    table = write_table(tmp_path, "t", summary, {"a": [], "b": []}, [0, 1], "cmd", ["x", "t"])
    assert "| a | 2.000 ± 1.414 | 5.000 (n=1) |" in table and "| b | 2.000 ± 0.000 | nan (n=0) |" in table
    assert "(mean ± std over seeds)" in (tmp_path / "table.md").read_text()
    one_seed = write_table(tmp_path, "t", summarise({"a": [{"x": 0.25}]}), {"a": []}, [2], "cmd", ["x"])
    assert "| a | 0.250 |" in one_seed and "one seed: no spread" in (tmp_path / "table.md").read_text()
    small = write_table(tmp_path, "t", summarise({"a": [{"x": 0.004027}, {"x": 0.0003}]}), {"a": []}, [0, 1], "cmd", ["x"])
    assert "| a | 0.00216 ± 0.00264 |" in small  # not "0.002 ± 0.003": a KL against its floor keeps its digits


def test_reuse_reads_a_run_kept_from_another_machine_and_leaves_local_runs_to_run_one(tmp_path, capsys):
    from slime_ext.tools.study import require_on_machine, reuse

    out, runs = tmp_path / "results", tmp_path / "runs"

    def finished(folder: Path, complete: bool = True) -> Path:
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"complete": complete}))
        return folder

    assert reuse(out, runs / "A-seed0", report_only=False) is None  # nothing anywhere: the study runs it
    assert reuse(out, runs / "A-seed0", report_only=True) is None
    kept = finished(out / "runs" / "A-seed0")
    assert reuse(out, runs / "A-seed0", report_only=False) == kept  # finished elsewhere: read, not run again
    assert "A-seed0: kept earlier in" in capsys.readouterr().out
    assert reuse(out, runs / "A-seed0", report_only=True) == kept
    local = finished(runs / "A-seed0" / "grpo-20261129-000000")
    assert reuse(out, runs / "A-seed0", report_only=False) is None  # run_one returns the local run (skipped)
    assert reuse(out, runs / "A-seed0", report_only=True) == local
    finished(out / "runs" / "B-seed0", complete=False)  # kept part-way (should not happen): not a finished run
    assert reuse(out, runs / "B-seed0", report_only=False) is None

    require_on_machine(local, "a run")  # present: no error
    with pytest.raises(SystemExit, match=r"the junior: .cache/x/hf is not in this machine's cache; restore it first"):
        require_on_machine(".cache/x/hf", "the junior")


def test_restore_tokenizer_builds_a_kept_runs_tokenizer_again_from_its_config(tmp_path, monkeypatch, capsys):
    """A kept run names its tokenizer by a cache path; on another machine the study builds it again from the run's
    config (data + tokenizer stages only) and gets the same files; a config that builds another one is an error."""
    import hashlib
    import shutil

    from slime_ext.orchestration import driver
    from slime_ext.tools import study

    monkeypatch.setattr(study, "REPO", tmp_path)  # the study's paths are under the repository; here under tmp_path
    small = ["run.stages=[data,tokenizer]", f"run.cache_dir={tmp_path / 'cache'}", "data.synthetic.n_train=300",
             "data.synthetic.n_eval=20", "tokenizer.n_training_texts=300"]
    assert driver.main([str(CONFIGS / "grpo.yaml"), *small, f"run.output_dir={tmp_path / 'first'}"]) == 0
    run = next((tmp_path / "first").iterdir())  # stands for a run kept in results/: its config and summary
    recorded = Path(json.loads((run / "summary.json").read_text())["stages"]["tokenizer"]["path"])
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in recorded.iterdir()}
    assert "tokenizer.json" in files
    assert study.restore_tokenizer(run, tmp_path / "again") == str(recorded)  # on the machine: nothing runs
    assert not (tmp_path / "again").exists()

    shutil.rmtree(recorded)  # another machine
    assert study.restore_tokenizer(run, tmp_path / "again") == str(recorded)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in recorded.iterdir()} == files
    assert "is not on this machine; building it again" in capsys.readouterr().out

    summary = json.loads((run / "summary.json").read_text())
    summary["stages"]["tokenizer"]["path"] = str(recorded.with_name("tok-640-other"))  # other data built it
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RuntimeError, match=rf"built the tokenizer {recorded}, not the .*tok-640-other"):
        study.restore_tokenizer(run, tmp_path / "third")


def test_read_metrics_reads_a_run_or_its_file_and_skips_a_torn_line(tmp_path, caplog):
    """The one reader of metrics.jsonl (plots, study scripts, tests): the run directory or the file; a line cut
    mid-write is skipped with a warning naming it, and a record without `step` takes its position (here 1)."""
    from slime_ext.studies import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "r": 0.5}\n{"r": 0.25}\n{"step": 2, "r"\n')
    with caplog.at_level("WARNING", logger="slime_ext.studies"):
        rows = read_metrics(tmp_path)
    assert rows == [{"step": 0, "r": 0.5}, {"r": 0.25, "step": 1}]
    assert read_metrics(tmp_path / "metrics.jsonl") == rows
    assert [r.getMessage().split(": ")[0] for r in caplog.records] == [f"{tmp_path / 'metrics.jsonl'}:3"] * 2


def test_there_is_one_metrics_reader():
    """`def read_metrics` once in the code, scripts, tests and results (two copies had drifted apart: one skipped
    bad lines, one raised)."""
    from tests.conftest import REPO

    found = [str(p.relative_to(REPO)) for top in ("slime_ext", "scripts", "tests", "results", "benchmarks")
             for p in sorted((REPO / top).rglob("*.py")) if "def read_metrics(" in p.read_text(errors="replace")
             and p.name != "test_studies.py"]
    assert found == ["slime_ext/studies/records.py"]
