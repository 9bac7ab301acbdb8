"""scripts/tandem_study.py on task v2, on fake runs: the junior each arm gets, the rows before RL, and the paired
team differences against hand-computed pass@k."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, fake_our_subprocesses
from tests.studies.test_studies import _report, study_script


def _study():
    return study_script("tandem_study")


def test_every_tandem_arm_on_v2_loads_shares_grpo_v2s_warm_start_and_is_judged_against_the_junior(tmp_path):
    """Each arm's composed config with the study's keys loads; TRL and KL-Reg train with the junior, every arm is
    judged against it; and what keys the SFT warm start equals configs/grpo_v2.yaml's with the same held-out set,
    so the arms (and the DUET study) share one warm start per seed."""
    from slime_ext.config import load_config
    from slime_ext.tools.study import config_on_task

    study = _study()
    junior = str(tmp_path / "junior" / "hf")

    def warm_start_inputs(cfg):
        return (cfg.model.model_dump(), cfg.sft.model_dump(), cfg.data.cache_fields(), cfg.train.micro_batch_size,
                cfg.rollout.max_prompt_len, cfg.rollout.max_response_len)

    grpo_v2 = load_config(CONFIGS / "grpo_v2.yaml", study.V2_HELD_OUT).config
    for method, config in study.METHODS.items():
        cfg = load_config(config_on_task(config, "v2", tmp_path / method),
                          study.arm_overrides("v2", method, junior, [])).config
        assert cfg.data.synthetic.step_separator == "\n" and warm_start_inputs(cfg) == warm_start_inputs(grpo_v2), method
        assert cfg.tandem_axes.junior_path == junior and cfg.tandem_axes.ks(cfg) == [1, 4, 8]
        assert cfg.tandem_axes.prompts == cfg.eval.n_prompts == 1026 and cfg.rollout.prompt_pool == 256
        assert cfg.eval.warm_start is (method == "GRPO")
        assert (getattr(getattr(cfg, "tandem", None), "junior_path", None) == junior) is (method != "GRPO")
    assert cfg.method == "tandem_klreg" and cfg.tandem.klreg_beta == 0.05
    # v1: the committed study's settings (paragraph steps, the warm start as junior)
    v1 = load_config(config_on_task("tandem.yaml", "v1", tmp_path / "v1"), study.arm_overrides("v1", "TRL", None, [])).config
    assert v1.data.synthetic.step_separator == "\n\n" and v1.tandem.junior_path is None


def _axes(correct: list[int], n: int = 8, drift: float = 0.01) -> dict:
    part = lambda: {"n_samples": n, "pass@1": sum(correct) / (n * len(correct)), "pass@8": 0.5,  # noqa: E731
                    "mean_correct": sum(correct) / (n * len(correct)), "senior_share_mean": 0.5,
                    "cached_token_share": 0.3, "correct_per_prompt": correct}
    d = {"kl_senior_junior": drift, "survival_thresholds": [0.0, 0.2], "survival": [1.0, 0.4]}
    return {"n_prompts": len(correct), "junior": "J", "handoff_alternate": part(), "handoff_bernoulli": part(),
            "drift": d, "drift_floor": dict(d, kl_senior_junior=drift / 10),
            "legibility": {"junior_ce_on_senior": 1.0, "overlap": 0.5}}


def _evaluator(record):
    """A stand-in for `eval_checkpoint`'s subprocess: records the command, writes the report the study reads (and the
    team axes beside it when asked for)."""
    def fake_eval(cmd, **_):
        record(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        _report(out, [[0.0, 0.0, 0.0, 1.0]] * 4)
        if "--tandem-junior" in cmd:
            out.with_name(out.stem + "_tandem_axes.json").write_text(json.dumps(_axes([2, 2, 2, 2])))
    return fake_eval


def test_tandem_study_v2_builds_one_junior_judges_every_arm_against_it_and_pairs_the_team_scores(tmp_path, monkeypatch):
    study = _study()

    solo = {"GRPO": [[0.0, 0.0, 1.0, 1.0]] * 4, "TRL": [[0.0, 1.0, 1.0, 1.0]] * 4, "KL-Reg": [[0.0, 0.0, 1.0, 1.0]] * 4}
    # team correct counts out of 8 per prompt: GRPO 4 of 8 everywhere, TRL 8 of 8, KL-Reg 0 of 8 on the first prompt
    team = {"GRPO": [4, 4, 4, 4], "TRL": [8, 8, 8, 8], "KL-Reg": [0, 4, 4, 4]}
    solo[("GRPO", 1)], team[("GRPO", 1)] = [[1.0, 1.0, 1.0, 1.0]] * 4, [8, 8, 8, 8]  # seed 1: GRPO solves everything
    launched: list[tuple[str, list[str]]] = []

    def fake_run(config, seed, parent, overrides, shared_sft_seed=0):
        launched.append((parent.name, list(overrides)))
        run = parent / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text(json.dumps({"complete": True, "stages": {"sft": {"warm_start": str(parent / "hf")}}}))
        (run / "config.yaml").write_text("method: grpo\n")
        (parent / "hf").mkdir(exist_ok=True)
        (parent / "hf" / "config.json").write_text("{}")  # the warm start (or junior) checkpoint
        if parent.name.startswith("junior"):  # the rebuilt junior (tag _b) solves everything, the first nothing
            _report(run / "eval_sft.json", [[float(parent.name.endswith("_b"))] * 4] * 4)
            return run
        method = parent.name.split("-seed")[0]
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward/mean": 0.5, "tandem/senior_token_share": 0.6})
                                                   + "\n" for i in range(3)))
        _report(run / "eval_final.json", solo.get((method, seed), solo[method]))
        (run / "tandem_axes.json").write_text(json.dumps(_axes(team.get((method, seed), team[method]))))
        return run

    evaluated: list[list[str]] = []
    fake_eval = _evaluator(lambda cmd: evaluated.append(cmd[3:]))

    monkeypatch.setattr(study, "run_one", fake_run)
    monkeypatch.setattr(study, "junior_run", lambda runs, name, steps, extra: fake_run(None, 0, runs / name, [
        f"sft.steps={steps}"]))
    fake_our_subprocesses(monkeypatch, fake_eval)
    runs, out = tmp_path / "runs", tmp_path / "out"
    assert study.main(["--seeds", "0", "--runs", str(runs), "--out", str(out)]) == 0

    junior = str(runs / "junior_sft900" / "hf")
    by_arm = dict(launched)
    assert by_arm["junior_sft900"] == ["sft.steps=900"]
    assert f"tandem_axes.junior_path={junior}" in by_arm["GRPO-seed0"]
    assert not any(o.startswith("tandem.junior_path") for o in by_arm["GRPO-seed0"])
    assert f"tandem.junior_path={junior}" in by_arm["TRL-seed0"] and "eval.warm_start=false" in by_arm["KL-Reg-seed0"]
    # the warm start against the same junior, and at T = 0.4, each once
    warm_run = runs / "GRPO-seed0" / "run"
    assert evaluated == [
        [str(runs / "GRPO-seed0" / "hf"), "--config", str(warm_run / "config.yaml"), "--no-progress", "--out",
         str(runs / "warm_axes-seed0" / "eval_warm.json"), "--tandem-junior", junior],
        [str(runs / "GRPO-seed0" / "hf"), "--config", str(warm_run / "config.yaml"), "eval.temperature=0.4",
         "eval.greedy=false", "--out", str(runs / "sharpening_T0.4-seed0" / "eval_sharpening.json")]]

    summary = json.loads((out / "table.json").read_text())["summary"]
    assert summary["TRL"]["solo_mean@4"][0] == 0.75 and summary["junior alone"]["solo_mean@4"][0] == 0.0
    assert summary["warm start, no RL (T = 1)"]["handoff_alt_mean"][0] == 0.25
    assert summary["GRPO"]["drift_kl_floor"][0] == pytest.approx(0.001)
    table = (out / "table.md").read_text()
    assert "| TRL | +25.0" in table and "| junior alone | -50.0" in table  # solo, paired over the 4 prompts
    # team pass@1 per prompt: c / 8. TRL - GRPO = +50 points everywhere; KL-Reg - GRPO = -50 on 1 prompt of 4:
    # -12.5. pass@8 = 1 when any of the 8 is right: KL-Reg loses it on the first prompt (-25), TRL gains nothing.
    assert "| TRL | alternate | +50.0 ± 0.0" in table and "| KL-Reg | alternate | -12.5" in table
    kl_row = next(line for line in table.splitlines() if line.startswith("| KL-Reg | bernoulli"))
    assert kl_row.split(" | ")[-1].startswith("-25.0")
    assert (out / "runs" / "TRL-seed0" / "tandem_axes.json").is_file()
    assert (out / "runs" / "warm_axes-seed0" / "eval_warm_tandem_axes.json").is_file()
    assert (out / "runs" / "junior_sft900" / "eval_sft.records.jsonl.gz").is_file()
    assert all((out / f).stat().st_size > 1000 for f in ("drift_survival.png", "reward.png"))

    # again: nothing is trained or evaluated twice, and --report-only tabulates the same
    assert study.main(["--seeds", "0", "--runs", str(runs), "--out", str(out)]) == 0 and len(evaluated) == 2
    assert study.main(["--seeds", "0", "--runs", str(runs), "--out", str(out), "--report-only"]) == 0

    # seed 1, with TRL's seed-0 run unfinished: TRL is paired with GRPO's seed 1 only (0.75 - 1.0 solo, 8/8 - 8/8
    # team), never with GRPO's seed 0 by position (that would read +25 and +50)
    assert study.main(["--seeds", "1", "--runs", str(runs), "--out", str(out)]) == 0
    summary_file = runs / "TRL-seed0" / "run" / "summary.json"
    summary_file.write_text(summary_file.read_text().replace('"complete": true', '"complete": false'))
    shutil.move(out / "runs" / "TRL-seed0", tmp_path / "TRL-seed0-kept")  # as if it had never finished
    assert study.main(["--seeds", "0", "1", "--runs", str(runs), "--out", str(out), "--report-only"]) == 0
    table = (out / "table.md").read_text()
    assert "| TRL | -25.0 ± 0.0 points (95% CI -25.0 to -25.0) (seed 1; not paired: 0) |" in table
    assert ("| TRL | alternate | +0.0 ± 0.0 points (95% CI +0.0 to +0.0), no measured difference "
            "(seed 1; not paired: 0)<br>s1 +0.0; one seed, no interval across seeds |") in table
    kl_reg = next(line for line in table.splitlines() if line.startswith("| KL-Reg | -"))
    assert kl_reg.startswith("| KL-Reg | -25.0 ± 9.4") and "not paired" not in kl_reg  # both seeds: (0 - 50) / 2
    # across the two seeds: SE = |0 - (-50)| / 2 = 25, t(0.975, 1 df) = 12.706: half-width 317.7 points
    assert kl_reg.endswith("| s0 +0.0, s1 -50.0; -25.0 ± 25.0 [-342.7, +292.7] (no measured difference) |")

    # seed 2 with its own junior (a rebuild: --junior-tag _b): built once in its own folder, recorded, used by seed 2's
    # arms and its "junior alone" row; seeds 0 and 1 keep junior_sft900
    assert study.main(["--seeds", "2", "--runs", str(runs), "--out", str(out), "--junior-tag", "_b"]) == 0
    rebuilt = str(runs / "junior_sft900_b" / "hf")
    by_arm = dict(launched)
    assert f"tandem.junior_path={rebuilt}" in by_arm["TRL-seed2"] and by_arm["junior_sft900_b"] == ["sft.steps=900"]
    assert json.loads((out / "runs" / "juniors.json").read_text()) == {"2": "junior_sft900_b"}
    with pytest.raises(SystemExit, match="seed 2 was run with the junior junior_sft900_b"):
        study.main(["--seeds", "2", "--runs", str(runs), "--out", str(out), "--junior-tag", "_c"])
    assert study.main(["--seeds", "0", "1", "2", "--runs", str(runs), "--out", str(out), "--report-only"]) == 0
    table = (out / "table.md").read_text().splitlines()
    assert "| junior alone | 0.333 ± 0.577 |" in "\n".join(table)  # the seeds' juniors: 0, 0 and 1
    junior_row = next(line for line in table if line.startswith("| junior alone | ") and "points" in line)
    assert junior_row.endswith(
        "| s0 -50.0, s1 -100.0, s2 +50.0; -33.3 ± 44.1 [-223.1, +156.4] (no measured difference) |")



def test_a_fresh_machine_goes_on_from_the_kept_runs_and_needs_the_checkpoints_they_name(tmp_path, monkeypatch):
    """On a machine that holds only `results/` (no `--runs`), every kept run is read, nothing is trained or evaluated
    again, and a seed whose warm-start evaluations are still to run stops with the checkpoint to restore named."""
    study = _study()
    launched: list[str] = []

    def fake_run(config, seed, parent, overrides, shared_sft_seed=0):
        launched.append(parent.name)
        run = parent / "run"
        run.mkdir(parents=True, exist_ok=True)
        warm = tmp_path / "cache" / f"warm{seed}" if not parent.name.startswith("junior") else tmp_path / "cache" / "jr"
        (warm / "hf").mkdir(parents=True, exist_ok=True)
        (warm / "hf" / "config.json").write_text("{}")
        sft = {"warm_start": str(warm / "hf")}
        (run / "summary.json").write_text(json.dumps({"complete": True, "stages": {"sft": sft}}))
        (run / "config.yaml").write_text("method: grpo\n")
        if parent.name.startswith("junior"):
            _report(run / "eval_sft.json", [[0.0, 0.0, 0.0, 0.0]] * 4)
            return run
        (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
        _report(run / "eval_final.json", [[0.0, 0.0, 1.0, 1.0]] * 4)
        (run / "tandem_axes.json").write_text(json.dumps(_axes([4, 4, 4, 4])))
        return run

    fake_eval = _evaluator(lambda cmd: launched.append("eval " + Path(cmd[cmd.index("--out") + 1]).parent.name))

    monkeypatch.setattr(study, "run_one", fake_run)
    monkeypatch.setattr(study, "junior_run",
                        lambda runs, name, steps, extra: fake_run(None, 0, runs / name, []))
    fake_our_subprocesses(monkeypatch, fake_eval)
    out = tmp_path / "out"
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "machine1"), "--out", str(out)]) == 0
    assert len(launched) == 6  # junior, three arms, the warm start's two evaluations
    first_table = (out / "table.md").read_text().split("date:")[1].split("\n", 1)[1]

    launched.clear()  # machine 2: an empty --runs; the kept runs are read, the checkpoints are in the cache
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "machine2"), "--out", str(out)]) == 0
    assert launched == [] and not (tmp_path / "machine2").exists()
    assert (out / "table.md").read_text().split("date:")[1].split("\n", 1)[1] == first_table

    # machine 3: the warm start's evaluations were not kept and seed 0's warm start is not restored: stop, naming it
    shutil.rmtree(out / "runs" / "warm_axes-seed0")
    shutil.rmtree(tmp_path / "cache" / "warm0")
    with pytest.raises(SystemExit, match=r"seed 0's warm start: .*warm0/hf is not in this machine's cache; "
                                         r"restore it first \(python -m slime_ext.tools.warm_start_archive unpack"):
        study.main(["--seeds", "0", "--runs", str(tmp_path / "machine3"), "--out", str(out)])
    assert launched == []
    assert study.main(["--seeds", "0", "--runs", str(tmp_path / "machine3"), "--out", str(out), "--report-only"]) == 0
    assert "not run: the warm start's evaluations, seed 0" in (out / "table.md").read_text()
