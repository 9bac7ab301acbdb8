"""DA-GRPO's per-prompt ask probability (slime_ext/methods/dagrpo/ask_probability.py): the AUC and its strata on
hand-computed cases, the sampling seeds, and a whole run directory evaluated on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_auc_counts_pairs_and_half_the_ties():
    from slime_ext.methods.dagrpo.ask_probability import auc, stratified_auc

    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    # pairs: (0.5 vs 0.5) tie 0.5, (0.5 vs 0.0) 1, (1.0 vs 0.5) 1, (1.0 vs 0.0) 1 -> 3.5 / 4
    assert auc([0.5, 1.0], [0.5, 0.0]) == pytest.approx(0.875)
    assert np.isnan(auc([], [0.1]))
    # within strata: A's positive beats its negative (1 pair), B's loses to both of its negatives (2 pairs): 1/3;
    # pooled across strata it would be 0.6 + ... (pairs across A and B), which the stratified AUC ignores
    scores = np.array([0.9, 0.1, 0.2, 0.5, 0.6])
    positive = np.array([True, False, True, False, False])
    strata = np.array(["A", "A", "B", "B", "B"])
    assert stratified_auc(scores, positive, strata) == pytest.approx(1 / 3)
    assert auc(scores[positive], scores[~positive]) == pytest.approx((3 + 0 + 0 + 0 + 0 + 1) / 6)


def test_summarise_hand_computed():
    """Four prompts, four samples each: p = 1, 0.5, 0.25, 0; greedy wrong on the first two (V2, V3), right on the
    last two (V2, V3): AUC 1 overall and within level; p wrong 0.75, right 0.125."""
    from slime_ext.methods.dagrpo.ask_probability import summarise

    def rec(asks, greedy_correct, level):
        return {"asks": asks, "greedy_correct": greedy_correct, "greedy_asked": False, "level": level,
                "correct": [0.0] * len(asks)}

    records = [rec([True] * 4, 0.0, "V2"), rec([True, True, False, False], 0.0, "V3"),
               rec([True, False, False, False], 1.0, "V2"), rec([False] * 4, 1.0, "V3")]
    s = summarise(records)
    assert s["mean_ask_probability"] == pytest.approx(1.75 / 4)
    assert (s["share_never_asks"], s["share_asks_over_half"], s["share_always_asks"]) == (0.25, 0.25, 0.25)
    assert (s["ask_probability_greedy_wrong"], s["ask_probability_greedy_right"]) == (0.75, 0.125)
    assert s["wrong_minus_right"] == pytest.approx(0.625)
    assert s["auc"] == 1.0 and s["auc_within_level"] == 1.0
    assert s["by_level"] == {"V2": pytest.approx(0.625), "V3": pytest.approx(0.25)}
    # if each level's prompts asked alike (V2 at 0.625, V3 at 0.25, 4 samples): p = 0 on (0.375^4 + 0.75^4) / 2,
    # p > 0.5 (3 or 4 asks) on (0.518799 + 0.050781) / 2
    assert s["share_never_asks_level_alone"] == pytest.approx((0.375 ** 4 + 0.75 ** 4) / 2)
    assert s["share_asks_over_half_level_alone"] == pytest.approx((0.5187988 + 0.0507813) / 2, abs=1e-6)
    assert s["greedy_wrong"] == s["greedy_right"] == 2 and s["greedy_asked"] == 0
    lo, hi = s["auc_95ci"]
    assert lo <= 1.0 <= hi
    # a level that asks more only because it is harder: V3 always asks, V2 never, both mixed wrong and right;
    # overall AUC 0.75 (wrong prompts are more often V3), within level 0.5: blind to competence inside a level
    blind = [rec([True] * 2, 0.0, "V3"), rec([True] * 2, 0.0, "V3"), rec([True] * 2, 1.0, "V3"),
             rec([False] * 2, 0.0, "V2"), rec([False] * 2, 1.0, "V2"), rec([False] * 2, 1.0, "V2")]
    s = summarise(blind)
    assert s["auc"] == pytest.approx((2 * 2 + 2 * 0.5 + 1 * 0.5 * 2 + 0) / 9)  # 6 / 9
    assert s["auc_within_level"] == pytest.approx(0.5)
    # a prompt whose greedy answer asked has no competence to judge: counted in the shares only
    s = summarise([dict(records[0], greedy_asked=True), *records[1:]])
    assert s["greedy_asked"] == 1 and s["greedy_wrong"] == 1 and s["ask_probability_greedy_wrong"] == 0.5


def test_samples_use_disjoint_seeds_and_sample_zero_is_the_phase_evaluations_draw():
    from slime_ext.methods.dagrpo.ask_probability import sample_asks

    calls = []

    class FakeMethod:
        def evaluate_rows(self, engine, rows, template, seed=0, baselines=True, records=None, temperature=0.0):
            calls.append((seed, temperature, baselines))
            for i, row in enumerate(rows):  # asks when its request seed is odd; greedy right on even prompts
                asked = temperature > 0 and (seed + i) % 2 == 1
                records.append({"prompt_id": str(i), "level": row["level"], "asked": asked,
                                "correct": float(asked or (temperature == 0 and i % 2 == 0))})
            return {}

    rows = [{"level": "V2"}, {"level": "V3"}, {"level": "V2"}]
    out = sample_asks(FakeMethod(), None, rows, "t", seed=10, samples=3, temperature=0.7)
    assert calls == [(10, 0.0, False), (10, 0.7, False), (13, 0.7, False), (16, 0.7, False)]
    # request seeds 10+i, 13+i, 16+i: prompt 0 gets 10, 13, 16 -> asks on the second only
    assert [r["asks"] for r in out] == [[False, True, False], [True, False, True], [False, True, False]]
    assert [r["greedy_correct"] for r in out] == [1.0, 0.0, 1.0] and out[1]["correct"] == [1.0, 0.0, 1.0]


def tiny_dagrpo_run(tmp_path, *overrides: str):
    """A run directory with a tiny model (hf/) and a DA-GRPO config of two phases of four held-out prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    from slime_ext.config import load_config
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from tests.conftest import CONFIGS
    from tests.megatron_fixtures import tiny_moe_config

    run = tmp_path / "run"
    hf = run / "hf"
    train_tokenizer(["Question: what is 1 + 2? Step 1: 1 + 2 = 3.\n\\boxed{3} I need assistance"] * 20,
                    vocab_size=300, out_dir=hf)
    torch.manual_seed(0)
    tok = load_tokenizer(hf)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), max_position_embeddings=2048)).save_pretrained(hf)
    phases = "[{name: easy, levels: [L1], steps: 1, tau: 0.2}, {name: hard, levels: [L3], steps: 1, tau: 0.2}]"
    resolved = load_config(CONFIGS / "dagrpo.yaml", [f"run.cache_dir={tmp_path / 'cache'}", "eval.n_prompts=4",
                                                     "eval.temperature=1.0", "rollout.max_response_len=12",
                                                     f"dagrpo.phases={phases}", "train.steps=2",
                                                     "dagrpo.cloud_url=solver:synthetic_math_answer", *overrides])
    resolved.write(run)
    return run, resolved.config, tok


def test_a_run_directory_is_evaluated_phase_by_phase(tmp_path, capsys):
    """`eval_checkpoint RUN --dagrpo-ask-samples 2 --skip-eval`: per phase 1 greedy + 2 sampled answers per prompt, one
    record per prompt per phase, sample 0 equal to a sampled evaluation at the run's seed, and no generic evaluation."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.orchestration.local_endpoints import build_run_method
    from slime_ext.tools.eval_checkpoint import main

    run, cfg, tok = tiny_dagrpo_run(tmp_path)
    assert main([str(run), "--dagrpo-ask-samples", "2", "--skip-eval", "--out", str(run / "eval.json")]) == 0
    assert not (run / "eval.json").exists()  # --skip-eval
    summary = json.loads((run / "eval_ask_probability.json").read_text())
    assert summary["samples"] == 2 and set(summary["phases"]) == {"easy", "hard"}
    records = [json.loads(x) for x in (run / "eval_ask_probability.records.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records] == ["easy"] * 4 + ["hard"] * 4
    assert all(len(r["asks"]) == len(r["correct"]) == 2 for r in records)
    assert "easy: mean p" in capsys.readouterr().out
    # sample 0 is drawn with the phase evaluation's seeds (run.seed + i)
    method = build_run_method(cfg, tok)
    again: list[dict] = []
    method.evaluate_rows(EmbeddedEngine.from_pretrained(str(run / "hf")), method.phase_rows(1)[1][:4], cfg.data.template,
                         seed=cfg.run.seed, baselines=False, records=again, temperature=1.0)
    assert [r["asked"] for r in again] == [r["asks"][0] for r in records[4:]]
    assert [r["correct"] for r in again] == [r["correct"][0] for r in records[4:]]


def test_bad_arguments_and_runs_that_cannot_ask_are_refused_with_the_reason(tmp_path, capsys):
    from slime_ext.config import load_config
    from slime_ext.tools.eval_checkpoint import main
    from tests.conftest import CONFIGS

    run, _, _ = tiny_dagrpo_run(tmp_path, "eval.temperature=0")
    assert main([str(run), "--dagrpo-ask-samples", "2", "--skip-eval"]) == 2
    assert "--dagrpo-ask-samples: eval.temperature is 0.0" in capsys.readouterr().err
    assert main([str(run), "--dagrpo-ask-samples", "zero", "--skip-eval"]) == 2
    assert "error: --dagrpo-ask-samples: a number of samples of at least 1, got 'zero'" in capsys.readouterr().err
    assert main([str(run), "--skip-eval"]) == 2
    assert "--skip-eval with no method evaluation to run" in capsys.readouterr().err
    load_config(CONFIGS / "dagrpo_local_only.yaml", [f"run.cache_dir={tmp_path / 'cache'}"]).write(run)
    assert main([str(run), "--dagrpo-ask-samples", "2", "--skip-eval"]) == 2
    assert "a local-only run never asks" in capsys.readouterr().err
