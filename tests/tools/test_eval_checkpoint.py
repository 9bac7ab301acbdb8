"""Held-out evaluation: exact metrics from a table-driven fake engine, the comparison table, and the CLI
on a tiny random HF checkpoint through the real embedded engine."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from slime_ext.config.sections import EvalConfig
from slime_ext.data.generation import GenerateResult
from slime_ext.evaluation import EvalReport, compare_table, evaluate, sample_seed

EOS = 0


class CharTokenizer:
    """One token per character (id = ord); id 0 is EOS, dropped by decode(skip_special_tokens=True)."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        assert skip_special_tokens, "evaluation must decode with skip_special_tokens=True"
        return "".join(chr(i) for i in ids if i != EOS)


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


# (prompt, label, responses of samples 0..3, greedy response, finish reasons of samples)
ROWS = [
    {"prompt": "2+5?", "label": "7"},
    {"prompt": "3*4?", "label": "12"},
    {"prompt": "9/3?", "label": "3"},
]
SAMPLES = {
    0: [r"\boxed{7}", r"\boxed{8}", r"so \boxed{7}", "seven"],       # 2 correct
    1: [r"\boxed{1}", "no idea", r"\boxed{13}", r"\boxed{12}"],     # 1 correct (the last)
    2: [r"\boxed{4}", r"\boxed{2}", "abc", "xxxxxxxxxx"],           # 0 correct, last one truncated
}
GREEDY = {0: r"\boxed{7}", 1: r"\boxed{21}", 2: "3"}
TRUNCATED = {(2, 3)}


class TableEngine:
    """Answers from the tables above by request id `eval-{row}-{sample|greedy}`; records every call."""

    def __init__(self, samples=SAMPLES, greedy=GREEDY):
        self.samples, self.greedy = samples, greedy
        self.calls: list[list] = []

    def generate(self, requests):
        self.calls.append(list(requests))
        out = []
        for req in reversed(requests):  # order must not matter: results are matched by rid
            _, row, j = req.rid.split("-")
            text = self.greedy[int(row)] if j == "greedy" else self.samples[int(row)][int(j)]
            cut = (int(row), j) in {(r, str(s)) for r, s in TRUNCATED}
            ids = encode(text) + ([] if cut else [EOS])
            out.append(GenerateResult(req.rid, ids, None, "length" if cut else "stop", [{}] * len(ids), 0,
                                      len(req.input_ids)))
        return out


def cfg(**kw) -> EvalConfig:
    base = dict(n_prompts=3, n_samples=4, k=[1, 2, 4], temperature=0.7, greedy=True)
    base.update(kw)
    return EvalConfig(**base)


def run_eval(engine=None, **kw):
    engine = engine or TableEngine()
    kw.setdefault("progress", False)
    return evaluate(engine, CharTokenizer(), ROWS, kw.pop("eval_cfg", cfg()), max_new_tokens=10, **kw), engine


def test_report_numbers_match_hand_computation():
    report, _ = run_eval()
    assert report.n_prompts == 3 and report.n_samples == 4
    # first-sample correctness 1,0,0; first-two 1/2,0,0; all four 2/4,1/4,0/4
    assert report.mean_at_k[1] == pytest.approx(1 / 3, abs=1e-12)
    assert report.mean_at_k[2] == pytest.approx(1 / 6, abs=1e-12)
    assert report.mean_at_k[4] == pytest.approx(0.25, abs=1e-12)
    # unbiased pass@k from (n=4, c) = (4,2), (4,1), (4,0)
    assert report.pass_at_k[1] == pytest.approx(0.25, abs=1e-12)
    assert report.pass_at_k[2] == pytest.approx((5 / 6 + 1 / 2 + 0) / 3, abs=1e-12)
    assert report.pass_at_k[4] == pytest.approx(2 / 3, abs=1e-12)
    assert report.greedy == pytest.approx(1 / 3, abs=1e-12)
    assert report.mean_at_1_stderr == pytest.approx(math.sqrt((1 / 3) * (2 / 3) / 3), abs=1e-12)
    assert report.mean_score == pytest.approx(0.25, abs=1e-12)
    # per-prompt means 0.5, 0.25, 0: population std / sqrt(3)
    assert report.mean_score_stderr == pytest.approx(math.sqrt((1 / 16 + 0 + 1 / 16) / 3 / 3), abs=1e-12)
    # lengths in tokens: characters + 1 EOS, except the truncated response (no EOS)
    lens = [len(t) + 1 for r in SAMPLES.values() for t in r]
    lens[-1] -= 1
    assert report.mean_response_len == pytest.approx(sum(lens) / 12, abs=1e-12)
    assert report.greedy_mean_response_len == pytest.approx((9 + 1 + 10 + 1 + 1 + 1) / 3, abs=1e-12)
    assert report.truncation_rate == pytest.approx(1 / 12, abs=1e-12)
    assert report.greedy_truncation_rate == 0.0
    assert report.reasons == {"correct": 3, "wrong": 5, "no_boxed": 4}
    assert report.greedy_reasons == {"correct": 1, "wrong": 1, "no_boxed": 1}
    ex = report.examples[0]
    assert (ex["prompt"], ex["label"], ex["response"], ex["score"]) == ("2+5?", "7", r"\boxed{7}", 1.0)
    assert ex["greedy_response"] == r"\boxed{7}" and report.examples[2]["finish_reason"] == "stop"

    d = json.loads(json.dumps(report.to_dict()))
    for key in ("mean@1", "mean@2", "mean@4", "pass@1", "pass@2", "pass@4", "greedy", "mean@1_stderr",
                "mean_response_len", "truncation_rate", "reasons", "examples", "n_prompts", "n_samples"):
        assert key in d, key
    assert d["pass@4"] == pytest.approx(2 / 3)
    from dataclasses import replace

    assert EvalReport.from_dict(d) == replace(report, records=[])  # records travel in their own file


def test_requests_seeds_greedy_and_batching():
    report, engine = run_eval(batch_prompts=2)
    assert [len(c) for c in engine.calls] == [10, 5]  # 2 prompts x (4 + greedy), then 1 x 5
    reqs = [r for c in engine.calls for r in c]
    sampled = [r for r in reqs if not r.rid.endswith("greedy")]
    greedy = [r for r in reqs if r.rid.endswith("greedy")]
    assert len(sampled) == 12 and len(greedy) == 3
    assert all(r.sampling.temperature == 0.7 and r.sampling.max_new_tokens == 10 for r in sampled)
    assert all(r.sampling.temperature == 0 for r in greedy)
    assert len({r.seed for r in reqs}) == 15  # distinct
    assert reqs[0].input_ids == encode("Question: 2+5?\nAnswer:\n")  # the "plain" template
    assert all(r.input_ids == encode("Question: 3*4?\nAnswer:\n") for r in reqs if r.rid.startswith("eval-1-"))
    # deterministic and independent of batching; another seed gives other seeds
    again, engine2 = run_eval(batch_prompts=64)
    assert len(engine2.calls) == 1
    assert {r.rid: r.seed for c in engine2.calls for r in c} == {r.rid: r.seed for r in reqs}
    assert again.to_dict()["pass@2"] == report.to_dict()["pass@2"]
    _, engine3 = run_eval(seed=1)
    assert not {r.seed for c in engine3.calls for r in c} & {r.seed for r in reqs}
    assert sample_seed(0, 1, 2) == sample_seed(0, 1, 2) != sample_seed(0, 2, 1)


def test_no_greedy_and_prompt_limit():
    report, engine = run_eval(eval_cfg=cfg(n_prompts=2, n_samples=2, k=[1, 2], greedy=False))
    reqs = engine.calls[0]
    assert len(reqs) == 4 and all(r.sampling.temperature == 0.7 for r in reqs)
    assert report.greedy is None and report.greedy_reasons == {} and report.n_prompts == 2
    assert report.mean_at_k[2] == pytest.approx((0.5 + 0.0) / 2)
    assert report.pass_at_k[2] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        evaluate(TableEngine(), CharTokenizer(), [], cfg(), progress=False)


def test_compare_table_rows_and_delta():
    sft, _ = run_eval()
    all_right = {i: [rf"\boxed{{{r['label']}}}"] * 4 for i, r in enumerate(ROWS)}
    grpo, _ = run_eval(TableEngine(samples=all_right, greedy={i: rf"\boxed{{{r['label']}}}" for i, r in enumerate(ROWS)}))
    assert grpo.mean_at_k[1] == 1.0 and grpo.greedy == 1.0
    table, note = compare_table({"warm start (SFT)": sft, "GRPO": grpo}).split("\n\n")
    lines = table.splitlines()
    assert len(lines) == 5
    assert "paired over the same 3 prompts" in note
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "mean@1", "mean@2", "mean@4", "pass@1", "pass@2", "pass@4", "greedy",
                      "mean length", "n"]
    sft_row = [c.strip() for c in lines[2].strip("|").split("|")]
    # SE over prompts with the sample standard deviation: first-sample scores [1, 0, 0] -> sqrt(1/3)/sqrt(3)
    assert sft_row[0] == "warm start (SFT)" and sft_row[1] == "33.3 ± 33.3" and sft_row[6] == "66.7"
    assert sft_row[-1] == "3x4"
    grpo_row = [c.strip() for c in lines[3].strip("|").split("|")]
    assert grpo_row[0] == "GRPO" and grpo_row[1].startswith("100.0") and grpo_row[7] == "100.0"
    delta = [c.strip() for c in lines[4].strip("|").split("|")]
    assert "GRPO - warm start (SFT)" in delta[0]
    # points: mean@1 100-33.3, mean@2 100-16.7, mean@4 100-25, pass@1 100-25, pass@2 100-44.4,
    # pass@4 100-66.7, greedy 100-33.3; mean@k and greedy are paired (3 prompts: every interval holds 0)
    assert [c.split(" ")[0] for c in delta[1:8]] == ["+66.7", "+83.3", "+75.0", "+75.0", "+55.6", "+33.3", "+66.7"]
    assert delta[1] == "+66.7 ± 33.3 [+0.0, +100.0] (n.s.)"
    # mean@2 per prompt: SFT [0.5, 0, 0] vs 1 -> d = [0.5, 1, 1]; its bootstrap means lie in [0.5, 1]
    assert delta[2] == "+83.3 ± 16.7 [+50.0, +100.0]" and delta[7].endswith("(n.s.)")
    assert delta[4:7] == ["+75.0", "+55.6", "+33.3"]  # pass@k: plain differences
    expected_len = grpo.mean_response_len - sft.mean_response_len
    assert delta[8] == f"{expected_len:+.1f}"
    flipped = compare_table({"GRPO": grpo, "warm start (SFT)": sft}).split("\n\n")[0].splitlines()[-1]
    assert "| -66.7 ± 33.3 [-100.0, -0.0] (n.s.) |" in flipped or "| -66.7 ± 33.3 [-100.0, +0.0] (n.s.) |" in flipped
    assert len(compare_table({"only": sft}).split("\n\n")[0].splitlines()) == 3  # no delta row for one model
    # without per-prompt records (an eval.json of an older run) the delta is the plain difference
    sft.records, grpo.records = [], []
    plain = compare_table({"warm start (SFT)": sft, "GRPO": grpo}).split("\n\n")[0].splitlines()[-1]
    assert [c.strip() for c in plain.strip("|").split("|")][1:4] == ["+66.7", "+83.3", "+75.0"]


def test_records_per_prompt_round_trip(tmp_path):
    report, _ = run_eval()
    assert [r["row"] for r in report.records] == [0, 1, 2]
    assert all(len(r["scores"]) == 4 and len(r["lengths"]) == 4 and "greedy_score" in r for r in report.records)
    # mean@k recomputed from the records equals the report's aggregate
    for k, value in report.mean_at_k.items():
        assert sum(report.prompt_scores(k)) / report.n_prompts == pytest.approx(value)
    from slime_ext.evaluation import load_report, records_path, save_report

    path = save_report(report, tmp_path / "eval_final.json")
    assert records_path(path).name == "eval_final.records.jsonl"
    assert "records" not in json.loads(path.read_text())
    loaded = load_report(path)
    assert loaded.records == report.records and loaded.mean_at_k == report.mean_at_k
    # a run's files as a study keeps them (records gzipped) load the same records
    from slime_ext.studies import keep_run_files

    keep_run_files(tmp_path, tmp_path / "kept", ("eval_final.json",))
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["eval_final.json", "eval_final.records.jsonl.gz"]
    assert load_report(tmp_path / "kept" / "eval_final.json").records == report.records


# -- the CLI on a real tiny checkpoint -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from slime_ext.tasks.synthetic_math import generate_dataset
    from slime_ext.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    ckpt = tmp_path_factory.mktemp("ckpt")
    rows = generate_dataset("L2", 50, seed=0, split="train")
    tok = train_tokenizer([r["prompt"] + "\n" + str(r.get("solution", r["label"])) for r in rows], vocab_size=300, out_dir=ckpt)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=32, max_position_embeddings=512,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen3ForCausalLM(config).save_pretrained(ckpt)
    return ckpt


def cli_overrides(tmp_path: Path) -> list[str]:
    return ["eval.n_prompts=3", "eval.n_samples=2", "eval.k=[1,2]", "rollout.max_response_len=6",
            "data.synthetic.n_train=50", "data.synthetic.n_eval=8", f"run.cache_dir={tmp_path / 'cache'}"]


def test_cli_on_tiny_checkpoint_writes_eval_json(tiny_checkpoint, tmp_path, capsys):
    from slime_ext.tools.eval_checkpoint import main

    out = tmp_path / "out"
    rc = main([str(tiny_checkpoint), "--no-progress", "--out", str(out), *cli_overrides(tmp_path)])
    assert rc == 0
    data = json.loads((out / "eval.json").read_text())
    assert data["n_prompts"] == 3 and data["n_samples"] == 2
    for key in ("mean@1", "mean@2", "pass@1", "pass@2", "greedy", "mean@1_stderr", "mean_response_len",
                "truncation_rate", "reasons", "examples", "meta"):
        assert key in data, key
    assert sum(data["reasons"].values()) == 6 and sum(data["greedy_reasons"].values()) == 3
    # shares of the 3 x 2 sampled responses: whole counts over 6
    for key in ("truncation_rate", "mean@1"):
        assert data[key] * 6 == pytest.approx(round(data[key] * 6), abs=1e-9) and 0 <= round(data[key] * 6) <= 6, key
    assert 1 <= data["mean_response_len"] <= 6 and len(data["examples"]) == 3
    truncated = round(data["truncation_rate"] * 6)  # a truncated response has all 6 tokens
    assert data["mean_response_len"] * 6 >= 6 * truncated + (6 - truncated)
    assert data["meta"]["max_new_tokens"] == 6 and data["meta"]["checkpoint"] == str(tiny_checkpoint)
    stdout = capsys.readouterr().out
    assert "| model | mean@1 | mean@2 | pass@1 | pass@2 | greedy |" in stdout
    assert f"| {tiny_checkpoint} |" in stdout and "3x2" in stdout

    # same checkpoint inside a run dir: found by the hf* rule (newest config.json), run config used
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("extends: " + str(Path(__file__).resolve().parents[2] / "configs/grpo.yaml")
                                     + "\neval:\n  n_prompts: 2\n  n_samples: 1\n  k: [1]\n  greedy: false\n")
    old = run / "checkpoints" / "step_1" / "hf"
    new = run / "checkpoints" / "step_2" / "hf"
    shutil.copytree(tiny_checkpoint, old)
    shutil.copytree(tiny_checkpoint, new)
    t = time.time()
    os.utime(old / "config.json", (t - 100, t - 100))
    os.utime(new / "config.json", (t, t))
    from slime_ext.tools.eval_checkpoint import find_checkpoint

    assert find_checkpoint(run) == (new, run)
    os.utime(old / "config.json", (t + 100, t + 100))
    assert find_checkpoint(run) == (old, run)
    rc = main([str(run), "--no-progress", "rollout.max_response_len=4", *cli_overrides(tmp_path)[4:]])
    assert rc == 0
    data = json.loads((old / "eval.json").read_text())
    assert (data["n_prompts"], data["n_samples"], data["greedy"]) == (2, 1, None)  # from the run's config.yaml


def test_cli_rejects_non_checkpoints(tmp_path, capsys):
    from slime_ext.tools.eval_checkpoint import find_checkpoint, main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "neither an HF checkpoint" in err
    assert main([str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    nowts = tmp_path / "nowts"
    nowts.mkdir()
    (nowts / "config.json").write_text("{}")
    assert main([str(nowts)]) == 2
    assert "no weights" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: grpo\n")
    with pytest.raises(ValueError, match="run directory without a checkpoint"):
        find_checkpoint(run)


def test_cli_evaluates_as_the_runs_method_does(tiny_checkpoint, tmp_path):
    """With an SxS config the report is the one the training job's evaluation gives: the method's sampler spec (tag
    structure), the projection it scores (the visible answer) and its latency metrics, i.e. `evaluate` with the
    method's `eval_options`. Without them (what the tool did before) the same checkpoint gives other records."""
    from slime_ext.config import load_config
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.evaluation import load_report, make_verifier
    from slime_ext.methods.registry import build_method
    from slime_ext.tokenizer import load_tokenizer
    from slime_ext.tools.eval_checkpoint import load_rows, main

    config = Path(__file__).resolve().parents[2] / "configs" / "sxs_sft.yaml"
    overrides = [*cli_overrides(tmp_path)[:3], "rollout.max_response_len=12", *cli_overrides(tmp_path)[4:]]
    assert main([str(tiny_checkpoint), "--config", str(config), "--no-progress", "--out", str(tmp_path / "out"),
                 *overrides]) == 0
    report = load_report(tmp_path / "out" / "eval.json")
    assert set(report.meta["response_metrics"]) >= {"ari", "abo", "airw", "think_blocks", "first_disclosure"}

    cfg = load_config(config, overrides).config
    tokenizer = load_tokenizer(tiny_checkpoint)
    rows = load_rows(cfg, None)

    def reference(**options):
        return evaluate(EmbeddedEngine.from_pretrained(str(tiny_checkpoint)), tokenizer, rows, cfg.eval,
                        reward_type=cfg.reward.type, template=cfg.data.template,
                        max_new_tokens=cfg.rollout.max_response_len, seed=cfg.run.seed, progress=False,
                        stop=cfg.rollout.stop, verifier=make_verifier(cfg.reward.type, cfg.reward.timeout_s),
                        **options)

    with_method = reference(**build_method(cfg, tokenizer).eval_options())
    assert report.records == with_method.records
    assert report.meta["response_metrics"] == pytest.approx(with_method.meta["response_metrics"], nan_ok=True)
    assert reference().records != report.records  # the tag structure changes what the random model says
