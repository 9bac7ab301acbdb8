"""SxS study: CoT-equivalent latency metrics by hand, SxS eval metrics without the EOS and tag texts, the
GRPO eval hook, and the study's table from fake run directories in the real file formats."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

from sglang_patches.sxs import SPEAK, THINK
from slime_ext.config import load_config
from slime_ext.config.sections import EvalConfig
from slime_ext.data.generation import GenerateResult
from slime_ext.evaluation import EvalReport, evaluate
from slime_ext.methods.sxs.metrics import (content_length, cot_channels, cot_latency_metrics, cot_response_metrics,
                                   latency_metrics)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

# "Step 1: 2 + 3 = 5.\n\n\boxed{5}" as the embedded BPE splits it: 11 reasoning tokens, 6 on the answer line
COT = ["Step", " ", "1", ":", " 2", " +", " 3", " =", " 5", ".\n", "\n", "\\", "box", "ed", "{", "5", "}"]


def test_cot_latency_metrics_by_hand():
    assert cot_channels(COT) == [THINK] * 11 + [SPEAK] * 6  # ".\n" and "\n" end before the answer line
    m = cot_latency_metrics(COT)
    assert m["ari"] == pytest.approx((12 + 13 + 14 + 15 + 16 + 17) / 6)
    assert (m["abo"], m["airw"], m["think_blocks"]) == (12, 11, 1)
    assert (m["total_len"], m["reasoning_len"], m["response_len"]) == (17, 11, 6)
    assert m["first_disclosure"] == 13  # "\" alone shows nothing; "\box" does

    # text after the answer line stays in the one speak block; an earlier \boxed line is reasoning
    early = ["\\", "box", "ed", "{", "4", "}", "\n", "Step", " 2", "\n", "\\", "box", "ed", "{", "5", "}", "\n", "ok"]
    assert cot_channels(early) == [THINK] * 10 + [SPEAK] * 8
    e = cot_latency_metrics(early)
    assert (e["think_blocks"], e["abo"], e["airw"], e["response_len"]) == (1, 11, 10, 8)
    assert e["ari"] == pytest.approx(sum(range(11, 19)) / 8)

    # the answer alone: no think block, no window; no \boxed at all: nothing disclosed
    alone = cot_latency_metrics(["\\", "box", "ed", "{", "5", "}"])
    assert (alone["think_blocks"], alone["abo"], alone["airw"], alone["first_disclosure"]) == (0, 1, 0, 2)
    none = cot_latency_metrics(["Step", " 1", ":", " 7"])
    assert none["think_blocks"] == 1 and none["response_len"] == 0 and none["reasoning_len"] == 4
    assert math.isnan(none["ari"]) and math.isnan(none["abo"]) and math.isnan(none["first_disclosure"])


class CharTokenizer:
    """One token per character (id = ord), id 0 is EOS; ids 1-4 are the SxS tags."""

    eos_token_id = 0
    unk_token_id = None
    TAGS = {"<think>": 1, "</think>": 2, "<speak>": 3, "</speak>": 4}

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def __len__(self) -> int:
        return 256

    def convert_tokens_to_ids(self, tokens):
        return [self.TAGS[t] for t in tokens]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.TAGS.items()}
        out = []
        for i in ids:
            if i == 0 or i in names:
                out.append("" if skip_special_tokens else ("<|endoftext|>" if i == 0 else names[i]))
            else:
                out.append(chr(i))
        return "".join(out)


def ids_of(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_content_length_and_cot_response_metrics_drop_the_eos():
    tok = CharTokenizer()
    ids = ids_of("ab\n\\boxed{5}") + [0]
    assert content_length(ids, 0) == 12 and content_length(ids[:-1], 0) == 12 and content_length([], 0) == 0
    m = cot_response_metrics(tok, ids)
    # "a", "b", "\n" think; the 9 characters of "\boxed{5}" speak; the EOS is not counted
    assert (m["total_len"], m["reasoning_len"], m["response_len"], m["think_blocks"]) == (12, 3, 9, 1)
    assert (m["abo"], m["airw"], m["first_disclosure"]) == (4, 3, 5)
    assert m["ari"] == pytest.approx(sum(range(4, 13)) / 9)


def test_let_me_work_through_it_is_not_a_disclosure():
    texts = ["a", "Let", " me", " work", " through", " it", ".", "\n\n", "After", " step"]
    channels = [THINK] + [SPEAK] * 9
    assert latency_metrics(channels, texts)["first_disclosure"] == 9


def test_sxs_eval_metrics_skip_the_eos_and_the_tag_texts():
    from slime_ext.methods.registry import build_method

    tok = CharTokenizer()
    method = build_method(load_config(CONFIGS / "sxs_rl.yaml").config, tok)
    ids = [1, ord("a"), 2, 3, *ids_of("Ok, 7"), 4, 0]
    # the channel sampler's annotations: tags carry their block's channel, the EOS outside a block is THINK
    channels = [THINK, THINK, THINK, SPEAK, SPEAK, SPEAK, SPEAK, SPEAK, SPEAK, SPEAK, THINK]
    result = GenerateResult("r", ids, None, "stop", [{"channel": c} for c in channels], 0, 3)
    m = method.response_metrics(result)
    assert (m["think_blocks"], m["total_len"], m["reasoning_len"], m["response_len"]) == (1, 10, 3, 7)
    assert (m["abo"], m["airw"]) == (4, 3) and m["ari"] == pytest.approx(sum(range(4, 11)) / 7)
    assert m["first_disclosure"] == 9  # not the "<speak>" tag (4), not the "Ok," acknowledgement


def test_grpo_eval_reports_cot_latency_metrics(tmp_path):
    """The GRPO eval hook (`GRPO.eval_options`, as the training job passes it) through `evaluate`: `meta.response_metrics`
    holds the means of the CoT metrics over the sampled responses (not the greedy one)."""
    from slime_ext.orchestration.training_job import TrainingJob

    tok = CharTokenizer()
    cfg = load_config(CONFIGS / "grpo.yaml").config
    job = TrainingJob(cfg, tmp_path, [], [], tok, tmp_path)
    options = job.method.eval_options()
    assert set(options) == {"response_metrics"}
    texts = {"0": "s\n\\boxed{1}", "1": "st\n\\boxed{1}", "greedy": "\\boxed{1}"}

    class Engine:
        def generate(self, requests):
            out = []
            for r in requests:
                ids = ids_of(texts[r.rid.split("-")[2]]) + [0]
                out.append(GenerateResult(r.rid, ids, None, "stop", [{}] * len(ids), 0, len(r.input_ids)))
            return out

    report = evaluate(Engine(), tok, [{"prompt": "q", "label": "1"}], EvalConfig(n_prompts=1, n_samples=2, k=[1, 2]),
                      progress=False, **options)
    rm = report.meta["response_metrics"]
    assert report.mean_at_k[2] == 1.0
    # response 0: 2 think + 9 speak tokens, response 1: 3 think + 9 speak
    assert (rm["reasoning_len"], rm["response_len"], rm["total_len"], rm["think_blocks"]) == (2.5, 9, 11.5, 1)
    assert rm["abo"] == pytest.approx(3.5) and rm["airw"] == pytest.approx(2.5)
    assert rm["ari"] == pytest.approx((7 + 8) / 2)  # speak positions 3..11 and 4..12
    assert rm["first_disclosure"] == pytest.approx(4.5)
    # the prompt's record keeps each sampled response's values (in sample order; the greedy one is not among them)
    per_sample = report.records[0]["response_metrics"]
    assert per_sample["reasoning_len"] == [2, 3] and per_sample["think_blocks"] == [1, 1]
    assert per_sample["ari"] == pytest.approx([7, 8])


# -- the study's table from fake run directories ------------------------------------------------------
def load_study():
    spec = importlib.util.spec_from_file_location("sxs_study", REPO / "scripts" / "sxs_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_json(acc: float, greedy: float, latency: dict) -> dict:
    """An eval json in the format `TrainingJob.evaluate` writes (EvalReport.to_dict)."""
    return EvalReport(n_prompts=4, n_samples=4, temperature=1.0, mean_at_k={1: acc, 4: acc},
                      pass_at_k={1: acc, 4: 1.0}, greedy=greedy, mean_score=acc, mean_score_stderr=0.1,
                      mean_at_1_stderr=0.1, mean_response_len=50.0, greedy_mean_response_len=50.0,
                      truncation_rate=0.25, greedy_truncation_rate=0.0, reasons={}, greedy_reasons={},
                      meta={"seed": 0, "response_metrics": latency}).to_dict()


def latency(ari: float, blocks: float, first=float("nan")) -> dict:
    return {"ari": ari, "abo": ari - 1, "airw": 10.0, "think_blocks": blocks, "total_len": 60.0, "reasoning_len": 40.0,
            "response_len": 20.0, "first_disclosure": first}


def fake_run(root: Path, slug: str, seed: int, warm: str, evals: dict, metrics: list[dict] = ()) -> Path:
    run = root / f"{slug}-seed{seed}" / f"{slug}-20260101-00000{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"stages": {"sft": {"warm_start": warm}}, "complete": True}))
    for name, data in evals.items():
        (run / name).write_text(json.dumps(data, indent=2))  # NaN written as the real eval does
    if metrics:
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run


def make_study(root: Path, seeds=(0, 1), sxs_warm=lambda seed, slug: "/c/warmstart/sxs/hf") -> None:
    for s in seeds:
        fake_run(root, "cot", s, "/c/warmstart/cot/hf",
                 {"eval_warm_start.json": eval_json(0.5 + s / 10, 0.6, latency(60.0 + s, 1.0, 58.0 + s)),
                  "eval_final.json": eval_json(0.8, 0.9, latency(62.0, 1.0, 60.0))},
                 [{"step": k, "reward/mean": 0.5 + k / 10} for k in range(3)])
        fake_run(root, "sxs_sft", s, sxs_warm(s, "sxs_sft"),
                 {"eval_sft.json": eval_json(0.4, 0.5, latency(45.0, 3.0 + s, 20.0))})
        for slug, blocks in (("sxs_rl", 3.0), ("sxs_rl_shaping", 4.0)):
            fake_run(root, slug, s, sxs_warm(s, slug),
                     {"eval_warm_start.json": eval_json(0.4, 0.5, latency(45.0, 3.0)),
                      "eval_final.json": eval_json(0.7 + s / 10, 0.75, latency(40.0 + 4 * s, blocks, 22.0))},
                     [{"step": k, "reward/mean": 0.1, "reward/correct": 0.6 + k / 10, "sxs/think_blocks": blocks + k}
                      for k in range(3)])


def test_study_table_from_fake_runs(tmp_path):
    study = load_study()
    make_study(tmp_path / "runs")
    assert study.main(["--task", "v1", "--report-only", "--seeds", "0", "1", "--runs", str(tmp_path / "runs"),
                       "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    s = table["summary"]
    assert list(s) == ["CoT SFT", "CoT SFT->RL", "SxS SFT", "SxS SFT->RL", "SxS SFT->RL +shaping"]
    assert s["CoT SFT"]["mean@4"] == pytest.approx([0.55, statistics.stdev([0.5, 0.6]), 2])
    assert s["CoT SFT"]["ARI"] == pytest.approx([60.5, statistics.stdev([60.0, 61.0]), 2])
    assert s["CoT SFT"]["first_disclosure"] == pytest.approx([58.5, statistics.stdev([58.0, 59.0]), 2])
    assert s["CoT SFT->RL"]["greedy"] == pytest.approx([0.9, 0.0, 2])
    assert s["CoT SFT->RL"]["ABO"] == pytest.approx([61.0, 0.0, 2])
    assert s["SxS SFT"]["think_blocks"] == pytest.approx([3.5, statistics.stdev([3.0, 4.0]), 2])
    assert "first_disclosure" in s["SxS SFT"] and s["SxS SFT"]["pass@4"] == pytest.approx([1.0, 0.0, 2])
    assert s["SxS SFT->RL"]["mean@4"] == pytest.approx([0.75, statistics.stdev([0.7, 0.8]), 2])
    assert s["SxS SFT->RL"]["ARI"] == pytest.approx([42.0, statistics.stdev([40.0, 44.0]), 2])
    assert s["SxS SFT->RL +shaping"]["think_blocks"] == pytest.approx([4.0, 0.0, 2])
    for arm in s:
        assert s[arm]["truncated"] == pytest.approx([0.25, 0.0, 2]) and s[arm]["AIRW"][0] == 10.0
        assert s[arm]["total_len"][0] == 60.0 and s[arm]["reasoning_len"][0] == 40.0
        assert s[arm]["response_len"][0] == 20.0
    assert table["runs"]["CoT SFT"] == table["runs"]["CoT SFT->RL"] and len(table["runs"]["SxS SFT"]) == 2
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| SxS SFT->RL | 0.750 ± 0.071 |" in md and "not run" not in md
    # the mechanism's own metrics are paired too; these fake runs kept no per-prompt records, and the table says so
    for metric in ("think_blocks", "airw", "first_disclosure"):
        assert f"## Difference to SxS SFT->RL (held-out, per-prompt mean of {metric} over samples" in md
        assert f"| SxS SFT->RL +shaping | - (no per-prompt {metric} in these runs' records) | - |" in md
    assert json.loads((tmp_path / "out" / "sxs_warm_starts.json").read_text()) == ["/c/warmstart/sxs/hf"] * 2
    assert (tmp_path / "out" / "block_count.png").stat().st_size > 0


def test_study_nan_latency_is_left_out_and_missing_runs_are_named(tmp_path):
    study = load_study()
    make_study(tmp_path / "runs", seeds=(0,))
    # the SxS SFT->RL eval of seed 0 disclosed nothing (NaN first disclosure): that cell is left out
    assert study.main(["--task", "v1", "--report-only", "--seeds", "0", "1", "--runs", str(tmp_path / "runs"),
                       "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "table.json").read_text())["summary"]
    assert "first_disclosure" not in study.row_of(next((tmp_path / "runs" / "sxs_rl-seed0").iterdir()),
                                                  "eval_warm_start.json")
    assert s["SxS SFT->RL"]["first_disclosure"] == pytest.approx([22.0, 0.0, 1])
    md = (tmp_path / "out" / "table.md").read_text()
    assert "not run: cot seed 1, sxs_sft seed 1, sxs_rl seed 1, sxs_rl_shaping seed 1" in md


def test_study_refuses_sxs_runs_from_different_warm_starts(tmp_path):
    study = load_study()
    make_study(tmp_path / "runs", seeds=(0,), sxs_warm=lambda seed, slug: f"/c/warmstart/{slug}/hf")
    with pytest.raises(RuntimeError, match="do not share one SFT warm start"):
        study.main(["--task", "v1", "--report-only", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])


# -- v2: the control arm, the CoT run's tokenizer, the DUET study's full-GRPO run as the CoT run ----------------------
def test_v2_runs_take_the_data_settings_and_the_cot_tokenizer_and_validate(tmp_path):
    from slime_ext.methods.registry import data_transform
    from slime_ext.methods.sxs.interleave import SxSRows
    from slime_ext.tools.study import config_on_task

    study = load_study()
    common = ["rollout.prompt_pool=256", "data.synthetic.n_eval=1026", "eval.n_prompts=1026"]
    sxs_data = ["sxs.disclosure_share=0.5", "rollout.max_response_len=640", "tokenizer.path=/tok"]
    assert study.run_overrides("v2", "cot", None, [], []) == common
    assert study.run_overrides("v2", "sxs_sft", "/tok", [], []) == common + sxs_data
    assert study.run_overrides("v2", "restated_rl", "/tok", ["x=1"], study.CONTROL_RUNS["restated_rl"][1]) == \
        common + sxs_data + ["eval.warm_start=false", "x=1", "sxs.answer_placement=after_reasoning", "sxs.qp_shaping=false"]
    assert study.run_overrides("v1", "sxs_rl", None, [], ["sxs.qp_shaping=true"]) == ["sxs.qp_shaping=true"]

    # every v2 run's keys are accepted by its composed config, and the two SxS formats get their transforms
    for slug, (config, extra) in {**study.RUNS, **study.CONTROL_RUNS}.items():
        cfg = load_config(config_on_task(config, "v2", tmp_path / slug),
                          study.run_overrides("v2", slug, None if slug == "cot" else "/tok", [], extra)).config
        assert cfg.data.synthetic.n_eval == 1026 and cfg.rollout.prompt_pool == 256
        if slug != "cot":
            placement = "after_reasoning" if slug.startswith("restated") else "interleaved"
            assert data_transform(cfg) == SxSRows(placement, 0.5) and cfg.tokenizer.path == "/tok"
            assert cfg.rollout.max_response_len == 640 and cfg.eval.warm_start == slug.endswith("_sft")

    # the CoT run is the DUET study's full-GRPO run: the same keys, so --cot-runs reuses it
    spec = importlib.util.spec_from_file_location("duet_study", REPO / "scripts" / "duet_study.py")
    duet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(duet)
    assert sorted(duet.arm_overrides("v2", "GRPO full", "grpo.yaml", list(duet.COMMON))) == sorted(common)


def test_v2_study_table_holds_the_control_and_pairs_it(tmp_path):
    study = load_study()
    root = tmp_path / "runs"
    make_study(root, seeds=(0,))
    for slug in ("restated_sft", "restated_rl"):
        fake_run(root, slug, 0, "/c/warmstart/restated/hf",
                 {"eval_sft.json": eval_json(0.3, 0.4, latency(80.0, 1.0, 70.0)),
                  "eval_final.json": eval_json(0.6, 0.7, latency(78.0, 1.0, 68.0))},
                 [{"step": k, "reward/correct": 0.5, "sxs/think_blocks": 1.0, "sxs/airw": 90.0} for k in range(3)])
    cot_summary = next((root / "cot-seed0").iterdir()) / "summary.json"
    summary = json.loads(cot_summary.read_text())
    summary["stages"]["tokenizer"] = {"path": ".cache/slime_ext/tokenizers/tok-640-x"}
    cot_summary.write_text(json.dumps(summary))
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "table.json").read_text())["summary"]
    assert list(s) == ["CoT SFT", "CoT SFT->RL", "SxS SFT", "SxS SFT->RL", "SxS SFT->RL +shaping", "Restated SFT",
                       "Restated SFT->RL"]
    assert s["Restated SFT"]["mean@4"] == pytest.approx([0.3, 0.0, 1]) and s["Restated SFT->RL"]["ARI"][0] == 78.0
    md = (tmp_path / "out" / "table.md").read_text()
    for reference in ("Restated SFT", "Restated SFT->RL", "CoT SFT->RL"):  # interleaving against restating, and CoT
        assert f"## Difference to {reference} " in md
    for metric in ("think_blocks", "airw", "first_disclosure"):  # the control's disclosure, paired too
        assert f"## Difference to Restated SFT (held-out, per-prompt mean of {metric} over samples" in md
        assert f"| SxS SFT | - (no per-prompt {metric} in these runs' records) | - |" in md
    assert json.loads((tmp_path / "out" / "sxs_warm_starts.json").read_text()) == \
        ["/c/warmstart/sxs/hf", "/c/warmstart/restated/hf"]
    assert study.tokenizer_of(cot_summary.parent) == str(REPO / ".cache/slime_ext/tokenizers/tok-640-x")
    assert "not run: CoT SFT, T = 0.4 (sharpening) seed 0, SxS SFT, T = 0.4 (sharpening) seed 0" in md

    # the sharpening rows: each format's warm start at T = 0.4 (CoT's kept by the DUET study), paired with its RL arm
    for folder, acc in (("sharpening_T0.4-seed0", 0.65), ("sxs_sharpening_T0.4-seed0", 0.55)):
        (tmp_path / "out" / "runs" / folder).mkdir(parents=True)
        (tmp_path / "out" / "runs" / folder / "eval_sharpening.json").write_text(
            json.dumps(eval_json(acc, float("nan"), latency(50.0, 2.0))))
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "table.json").read_text())["summary"]
    assert list(s)[:5] == ["CoT SFT", "CoT SFT, T = 0.4 (sharpening)", "CoT SFT->RL", "SxS SFT",
                           "SxS SFT, T = 0.4 (sharpening)"]
    assert s["CoT SFT, T = 0.4 (sharpening)"]["mean@4"][0] == 0.65 and s["SxS SFT, T = 0.4 (sharpening)"]["mean@4"][0] == 0.55
    md = (tmp_path / "out" / "table.md").read_text()
    assert "## Difference to CoT SFT, T = 0.4 (sharpening) " in md and "## Difference to SxS SFT, T = 0.4 (sharpening) " in md
    assert "not run" not in md
    assert "| first_disclosure_s |" in md and "first_disclosure_s" not in s["SxS SFT"]  # a column, none measured

    # latency in seconds: a kept timeline is read (report-only measures nothing); SxS arms read the speak stream
    timing = tmp_path / "out" / "latency" / "seed0"
    timing.mkdir(parents=True)
    (timing / "SxS_SFT.timing.jsonl").write_text(json.dumps({"deltas": [[0.2, "Okay."], [0.5, "After step 1"], [0.9, ""]]}) + "\n")
    (timing / "CoT_SFT_to_RL.timing.jsonl").write_text(json.dumps({"deltas": [[0.4, "Step 1\n"], [1.5, "\\boxed{3}"], [1.6, ""]]}) + "\n")
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "table.json").read_text())["summary"]
    assert (s["SxS SFT"]["first_visible_s"][0], s["SxS SFT"]["first_disclosure_s"][0], s["SxS SFT"]["total_s"][0]) == (0.2, 0.5, 0.9)
    assert (s["CoT SFT->RL"]["first_visible_s"][0], s["CoT SFT->RL"]["total_s"][0]) == (1.5, 1.6)
    assert "first_visible_s" not in s["Restated SFT"]
    assert "## Latency in seconds" not in (tmp_path / "out" / "table.md").read_text()  # no pair has both timelines

    # the seconds paired by prompt (SxS SFT minus the restated control, three prompts timed in different orders):
    # first visible -0.2, -0.4, -0.3 s: -0.300, SE 0.1 / sqrt(3); first disclosure -0.3, -0.5 and p3 left out (the
    # control disclosed nothing there): -0.400, SE 0.1 over 2; the ends -0.1, -0.1, -0.3: -0.167, SE 0.0667
    def timelines(rows):
        return "".join(json.dumps({"prompt_id": p, "deltas": d}) + "\n" for p, d in rows)

    (timing / "SxS_SFT.timing.jsonl").write_text(timelines((
        ("p1", [[0.2, "Okay."], [0.5, "After step 1"], [0.9, ""]]), ("p2", [[0.1, "Step 2 gives 7"], [0.6, ""]]),
        ("p3", [[0.3, "Step 1 gives 2"], [0.5, ""]]))))
    (timing / "Restated_SFT.timing.jsonl").write_text(timelines((
        ("p3", [[0.6, "Okay."], [0.8, ""]]), ("p2", [[0.5, "Okay."], [0.6, "Step 2 gives 7"], [0.7, ""]]),
        ("p1", [[0.4, "Okay."], [0.8, "The answer is 3"], [1.0, ""]]))))
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "table.md").read_text()
    section = md[md.index("## Latency in seconds: SxS SFT minus Restated SFT"):]
    assert "| first_visible_s | -0.300 ± 0.058 s" in section and "| 3 |" in section
    assert "| first_disclosure_s | -0.400 ± 0.100 s" in section and "| 2 |" in section
    assert "| total_s | -0.167 ± 0.067 s" in section
    assert "| 3 | s0 -0.300; one seed, no interval across seeds |" in section
    assert "## Latency in seconds: SxS SFT minus CoT SFT" not in md  # CoT SFT was not streamed
    # CoT is visible from its \\boxed line: first visible 0.2 - 1.5 and 0.1 - 0.9 s, mean -1.05, SE 0.25
    (timing / "CoT_SFT.timing.jsonl").write_text(timelines((("p1", [[0.4, "Step 1\n"], [1.5, "\\boxed{3}"], [1.6, ""]]),
                                                           ("p2", [[0.2, "Step 1\n"], [0.9, "\\boxed{7}"], [1.0, ""]]))))
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| first_visible_s | -1.050 ± 0.250 s" in md[md.index("## Latency in seconds: SxS SFT minus CoT SFT"):]

    # without a finished CoT run the SxS-format runs cannot have its tokenizer: named as not run
    (root / "cot-seed0").rename(root / "elsewhere")
    assert study.main(["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root),
                       "--out", str(tmp_path / "out2")]) == 0
    assert "not run: cot seed 0, sxs_sft seed 0, sxs_rl seed 0" in (tmp_path / "out2" / "table.md").read_text()


def test_v2_cot_run_is_read_from_the_duet_studys_kept_runs(tmp_path):
    """On a machine without the DUET study's runs folder the CoT run is its copy kept in results/duet_study_v2."""
    study = load_study()
    root = tmp_path / "runs"
    make_study(root, seeds=(0,))
    kept = tmp_path / "duet_out" / "runs" / "GRPO_full-seed0"
    next((root / "cot-seed0").iterdir()).rename(kept.parent.mkdir(parents=True) or kept)  # as keep_run_files lays it
    (root / "cot-seed0").rmdir()
    summary = json.loads((kept / "summary.json").read_text())
    summary["stages"]["tokenizer"] = {"path": ".cache/slime_ext/tokenizers/tok-640-x"}
    (kept / "summary.json").write_text(json.dumps(summary))
    args = ["--task", "v2", "--report-only", "--seeds", "0", "--runs", str(root), "--out", str(tmp_path / "out"),
            "--cot-runs", str(tmp_path / "duet_runs")]
    assert study.main([*args, "--cot-kept", str(tmp_path / "duet_out")]) == 0
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    assert table["runs"]["CoT SFT->RL"] == [str(kept)] and table["summary"]["CoT SFT->RL"]["mean@4"][0] == 0.8
    assert "## Difference to CoT SFT->RL " in (tmp_path / "out" / "table.md").read_text()
    assert study.main([*args, "--cot-kept", str(tmp_path / "nowhere")]) == 0  # not kept there: not run, named
    assert "not run: cot seed 0" in (tmp_path / "out" / "table.md").read_text()


def test_v2_sharpening_is_read_where_kept_else_evaluated_once_and_kept(tmp_path, monkeypatch, capsys):
    """CoT's comes from the DUET study (its runs folder, then its kept copy); SxS's is evaluated from the SFT run's warm
    start at T = 0.4 and kept under --out/runs/, so the next report reads it; nothing is evaluated with --report-only
    or without the warm start's weights on the machine."""
    import argparse

    study = load_study()
    warm = tmp_path / "warm" / "hf"
    warm.mkdir(parents=True)
    sxs_run = fake_run(tmp_path / "runs", "sxs_sft", 0, str(warm), {})
    calls = []

    def fake_eval(run, t, folder):
        calls.append((run, t, folder))
        folder.mkdir(parents=True)
        (folder / "eval_sharpening.json").write_text("{}")
        return folder / "eval_sharpening.json"

    monkeypatch.setattr(study, "sharpening_eval", fake_eval)
    args = argparse.Namespace(out=tmp_path / "out", runs=tmp_path / "runs", cot_runs=tmp_path / "duet_runs",
                              cot_kept=tmp_path / "duet_out", report_only=True)
    assert study.sharpening_report(args, "SxS", sxs_run, 0, 0.4) is None and calls == []
    args.report_only = False
    evaluated = study.sharpening_report(args, "SxS", sxs_run, 0, 0.4)
    assert calls == [(sxs_run, 0.4, tmp_path / "runs" / "sxs_sharpening_T0.4-seed0")]
    assert evaluated == tmp_path / "runs" / "sxs_sharpening_T0.4-seed0" / "eval_sharpening.json"
    kept = tmp_path / "out" / "runs" / "sxs_sharpening_T0.4-seed0" / "eval_sharpening.json"
    assert kept.read_text() == "{}"
    assert study.sharpening_report(args, "SxS", sxs_run, 0, 0.4) == kept and len(calls) == 1

    duet_kept = tmp_path / "duet_out" / "runs" / "sharpening_T0.4-seed1" / "eval_sharpening.json"
    duet_kept.parent.mkdir(parents=True)
    duet_kept.write_text("{}")
    assert study.sharpening_report(args, "CoT", sxs_run, 1, 0.4) == duet_kept
    duet_run = tmp_path / "duet_runs" / "sharpening_T0.4-seed1" / "eval_sharpening.json"
    duet_run.parent.mkdir(parents=True)
    duet_run.write_text("{}")
    assert study.sharpening_report(args, "CoT", sxs_run, 1, 0.4) == duet_run and len(calls) == 1

    gone = fake_run(tmp_path / "runs", "sxs_sft", 2, str(tmp_path / "elsewhere" / "hf"), {})
    assert study.sharpening_report(args, "SxS", gone, 2, 0.4) is None and len(calls) == 1
    assert "not on this machine" in capsys.readouterr().out


def test_v2_study_streams_each_arm_as_its_run_finishes(tmp_path, monkeypatch):
    """A seed stopped part-way (here: its restated SFT fails) keeps the seconds of every arm that finished before."""
    study = load_study()
    root, events = tmp_path / "runs", []
    warm = {"cot": "/c/warmstart/cot/hf", "restated_sft": "/c/warmstart/restated/hf"}

    def run_one(config, seed, parent, overrides, shared_sft_seed=0):
        slug = Path(parent).name.rsplit("-seed", 1)[0]
        events.append(f"run {slug}")
        if slug == "restated_sft":
            raise RuntimeError("stopped")
        return fake_run(root, slug, seed, warm.get(slug, "/c/warmstart/sxs/hf"),
                        {"eval_warm_start.json": eval_json(0.5, 0.6, latency(60.0, 1.0)),
                         "eval_sft.json": eval_json(0.4, 0.5, latency(45.0, 3.0)),
                         "eval_final.json": eval_json(0.7, 0.8, latency(40.0, 3.0))})

    def seconds_row(run, eval_name, arm, folder, prompts, measure=True):
        events.append(f"stream {arm}")
        return {"first_visible_s": 0.25}

    monkeypatch.setattr(study, "run_one", run_one)
    monkeypatch.setattr(study, "seconds_row", seconds_row)
    monkeypatch.setattr(study, "tokenizer_of", lambda run: "/tok")
    monkeypatch.setattr(study, "restore_tokenizer", lambda run, folder: "/tok")
    monkeypatch.setattr(study, "sharpening_report", lambda *a: None)
    with pytest.raises(RuntimeError, match="stopped"):
        study.main(["--task", "v2", "--seeds", "0", "--runs", str(root), "--out", str(tmp_path / "out"),
                    "--cot-kept", str(tmp_path / "none")])
    assert events == ["run cot", "stream CoT SFT", "stream CoT SFT->RL", "run sxs_sft", "stream SxS SFT",
                      "run sxs_rl", "stream SxS SFT->RL", "run sxs_rl_shaping", "stream SxS SFT->RL +shaping",
                      "run restated_sft"]


def test_seconds_across_seeds_is_a_t_interval_over_each_seeds_mean_pair(tmp_path):
    """Seed 0: first visible -0.2 and -0.4 s (mean -0.3); seed 1: -0.1 s on its one prompt. Pooled over the three
    prompts -0.233 ± 0.088 (sd 0.153); across seeds mean -0.2, SE 0.1 (sd 0.1414 / sqrt 2), t(1) = 12.706: [-1.471, +1.071]."""
    study = load_study()

    def write(seed: int, arm: str, rows) -> None:
        folder = tmp_path / "latency" / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        study.timing_path(folder, arm).write_text(
            "".join(json.dumps({"prompt_id": p, "deltas": [[t, "Okay."], [t + 0.1, ""]]}) + "\n" for p, t in rows))

    write(0, "SxS SFT", (("p1", 0.2), ("p2", 0.1)))
    write(0, "Restated SFT", (("p2", 0.5), ("p1", 0.4)))
    write(1, "SxS SFT", (("p1", 0.3),))
    write(1, "Restated SFT", (("p1", 0.4), ("p9", 0.2)))  # p9: timed in one arm only, left out
    section = study.seconds_difference_table(tmp_path, "Restated SFT", "SxS SFT", [0, 1, 2])  # seed 2: not streamed
    assert "within seeds [0, 1]," in section
    row = next(line for line in section.splitlines() if line.startswith("| first_visible_s |"))
    assert "-0.233 ± 0.088 s" in row and "| 3 |" in row
    assert row.endswith("| s0 -0.300, s1 -0.100; -0.200 ± 0.100 [-1.471, +1.071] (no measured difference) |")


def test_seconds_pair_only_timelines_streamed_in_one_session(tmp_path):
    """Seed 1's SxS SFT was streamed on an older machine (the seed's folder, no session recorded) and again, beside
    the restated control, in a later session: the pair uses the later session's two timelines (-0.1 s), not the
    older SxS one (-0.3 s); SxS SFT->RL has only the older session, so it does not pair with Restated SFT->RL."""
    study = load_study()
    from slime_ext.tools.stream_sessions import folder_for_new_stream

    seed = tmp_path / "latency" / "seed1"
    later = {"host": "vm", "boot_id": "b07c71ae-0000", "date": "20261207"}

    def write(folder: Path, arm: str, t: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        study.timing_path(folder, arm).write_text(json.dumps({"prompt_id": "p1", "deltas": [[t, "Okay."], [t + 0.1, ""]]}) + "\n")

    write(seed, "SxS SFT", 0.1)
    write(seed, "SxS SFT->RL", 0.1)
    new = folder_for_new_stream(seed, later)  # the older folder holds another session's timelines
    assert new == seed / "20261207-vm-b07c71ae" and json.loads((new / "session.json").read_text())["boot_id"] == "b07c71ae-0000"
    assert folder_for_new_stream(seed, later) == new  # the same session writes on there
    write(new, "Restated SFT", 0.4)
    write(new, "Restated SFT->RL", 0.4)
    write(new, "SxS SFT", 0.3)
    (seed / "superseded").mkdir()
    write(seed / "superseded", "Restated SFT->RL", 0.2)  # not a session: never paired
    write(seed / "superseded", "SxS SFT->RL", 0.2)
    section = study.seconds_difference_table(tmp_path, "Restated SFT", "SxS SFT", [1])
    row = next(line for line in section.splitlines() if line.startswith("| first_visible_s |"))
    assert "s1 -0.100" in row
    assert study.seconds_difference_table(tmp_path, "Restated SFT->RL", "SxS SFT->RL", [1]) is None
    write(tmp_path / "latency" / "seed0", "Restated SFT->RL", 0.5)
    write(tmp_path / "latency" / "seed0", "SxS SFT->RL", 0.2)
    section = study.seconds_difference_table(tmp_path, "Restated SFT->RL", "SxS SFT->RL", [0, 1])
    assert "within seeds [0]" in section and "different sessions (machine or boot): seeds [1]" in section
    # an empty seed folder takes the first session's timelines itself
    assert folder_for_new_stream(tmp_path / "latency" / "seed5", later) == tmp_path / "latency" / "seed5"


def test_a_later_session_streams_the_arms_compared_with_beside_it(tmp_path, monkeypatch, capsys):
    """Seed 2's SxS SFT was streamed in its first session; its restated SFT finishes in a later one (another boot):
    the restated timeline goes to the later session's folder and SxS SFT (its partner in seconds) is streamed again
    there, CoT SFT (not its partner) is not, and a partner whose weights are gone is named, not streamed."""
    study = load_study()
    import slime_ext.tools.stream_sessions as sessions

    seed = tmp_path / "latency" / "seed2"
    seed.mkdir(parents=True)
    study.timing_path(seed, "SxS SFT").write_text(json.dumps({"prompt_id": "p1", "deltas": [[0.9, "Okay."]]}) + "\n")
    monkeypatch.setattr(sessions, "current_session", lambda: {"host": "vm", "boot_id": "later-boot", "date": "20261208"})
    weights = tmp_path / "w"
    weights.mkdir()
    monkeypatch.setattr(study, "checkpoint_of", lambda run, eval_name: str(weights if run.name != "gone" else tmp_path / "gone"))
    streamed = []

    def fake_stream(cmd, cwd, check):
        out = Path(cmd[cmd.index("--out") + 1])
        streamed.append((out.parent.name, out.name))
        out.write_text(json.dumps({"prompt_id": "p1", "deltas": [[0.2, "Okay."]]}) + "\n")

    monkeypatch.setattr(study.subprocess, "run", fake_stream)
    finished = {"SxS SFT": (tmp_path / "sxs", "eval_sft.json"), "CoT SFT": (tmp_path / "cot", "eval_sft.json"),
                "Restated SFT": (tmp_path / "restated", "eval_sft.json")}
    pairs = study.seconds_pairs(True)
    assert study.seconds_row(tmp_path / "restated", "eval_sft.json", "Restated SFT", seed, 64)["first_visible_s"] == 0.2
    study.stream_partners("Restated SFT", seed, finished, pairs, 64)
    later = "20261208-vm-later-bo"
    assert streamed == [(later, "Restated_SFT.timing.jsonl"), (later, "SxS_SFT.timing.jsonl")]
    study.stream_partners("Restated SFT", seed, finished, pairs, 64)  # already beside it: not streamed again
    assert len(streamed) == 2
    section = study.seconds_difference_table(tmp_path, "Restated SFT", "SxS SFT", [2])
    assert "| first_visible_s | +0.000" in section  # the later session's pair (0.2 - 0.2), not 0.9 - 0.2
    # the seed's first session does not stream partners again; a partner without weights is named
    assert study.stream_partners("SxS SFT", tmp_path / "latency" / "seed7", finished, pairs, 64) is None
    study.stream_partners("SxS SFT->RL +shaping", seed, {"SxS SFT->RL": (tmp_path / "gone", "eval_final.json")}, pairs, 64)
    assert "SxS SFT->RL: latency not measured" in capsys.readouterr().out and len(streamed) == 2


def test_v2_study_streams_the_partner_of_an_arm_streamed_in_a_later_session(tmp_path, monkeypatch):
    """The study loop: seed 0's SxS arms were streamed in an earlier session (the seed's folder); its restated SFT
    finishes in a later boot, so the study streams it into that session's folder and streams SxS SFT (its partner in
    seconds) again beside it; arms already streamed are only read."""
    study = load_study()
    import slime_ext.tools.stream_sessions as sessions

    root, out, events = tmp_path / "runs", tmp_path / "out", []
    seed = out / "latency" / "seed0"
    seed.mkdir(parents=True)
    for arm in ("CoT SFT", "CoT SFT->RL", "SxS SFT", "SxS SFT->RL", "SxS SFT->RL +shaping"):
        study.timing_path(seed, arm).write_text(json.dumps({"prompt_id": "p1", "deltas": [[0.5, "Okay."]]}) + "\n")
    monkeypatch.setattr(sessions, "current_session", lambda: {"host": "vm", "boot_id": "later-boot", "date": "20261208"})

    def run_one(config, seed, parent, overrides, shared_sft_seed=0):
        slug = Path(parent).name.rsplit("-seed", 1)[0]
        if slug == "restated_rl":
            raise RuntimeError("stopped")
        return fake_run(root, slug, seed, "/c/warmstart/w/hf", {n: eval_json(0.5, 0.6, latency(45.0, 3.0)) for n in
                                                                 ("eval_warm_start.json", "eval_sft.json", "eval_final.json")})

    def stream_arm(run, eval_name, arm, folder, prompts):
        timing = study.timing_path(sessions.folder_for_new_stream(folder), arm)
        events.append((arm, timing.parent.name))
        timing.write_text(json.dumps({"prompt_id": "p1", "deltas": [[0.2, "Okay."]]}) + "\n")
        return timing

    monkeypatch.setattr(study, "run_one", run_one)
    monkeypatch.setattr(study, "stream_arm", stream_arm)
    monkeypatch.setattr(study, "tokenizer_of", lambda run: "/tok")
    monkeypatch.setattr(study, "restore_tokenizer", lambda run, folder: "/tok")
    monkeypatch.setattr(study, "sharpening_report", lambda *a: None)
    with pytest.raises(RuntimeError, match="stopped"):
        study.main(["--task", "v2", "--seeds", "0", "--runs", str(root), "--out", str(out),
                    "--cot-kept", str(tmp_path / "none")])
    assert events == [("Restated SFT", "20261208-vm-later-bo"), ("SxS SFT", "20261208-vm-later-bo")]


def test_the_block_count_plot_names_each_line_by_its_seed(tmp_path, monkeypatch):
    """Kept runs all live in one `runs/` folder, so a label from the run's folder read "(runs)" for every seed; the
    legend must say which seed each line style is."""
    study = load_study()
    runs = {}
    for seed in (0, 2):
        run = tmp_path / "runs" / f"sxs_rl-seed{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "sxs/think_blocks": 3.0 + seed, "sxs/airw": 40.0,
                                                               "reward/correct": 0.5}) + "\n" for s in range(3)))
        runs[seed] = run
    figures = []
    monkeypatch.setattr(study, "save_figure", lambda fig, path: figures.append(fig) or path)
    study.plots(tmp_path, {"SxS SFT->RL": {2: runs[2], 0: runs[0]}})
    blocks = figures[0].axes[0]
    assert [line.get_label() for line in blocks.lines] == ["SxS SFT->RL, seed 0", "SxS SFT->RL, seed 2"]
    assert [line.get_ydata()[0] for line in blocks.lines] == [3.0, 5.0]
    assert [line.get_linestyle() for line in blocks.lines] == ["-", "--"]
