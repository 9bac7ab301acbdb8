"""SxS: latency metrics by hand, the exact shaping QP against a brute-force KKT solver, the channel sampler."""

from __future__ import annotations

import itertools
import math
import random
import re

import numpy as np
import pytest
import torch

from sglang_patches.request_sampler import RequestView, build_sampler, replay_annotations
from sglang_patches.sxs import SPEAK, THINK, visible_token_ids
from slime_ext.methods.sxs.metrics import latency_metrics, runs, strip_acknowledgements
from slime_ext.methods.sxs.shaping import check_separation, shaping_targets, solve_shaping_qp


def test_latency_metrics_by_hand():
    ch = [THINK, THINK, SPEAK, SPEAK, THINK, SPEAK, SPEAK, SPEAK]
    assert runs(ch) == [(0, 1, 2), (1, 3, 2), (0, 5, 1), (1, 6, 3)]
    m = latency_metrics(ch)
    assert m["ari"] == pytest.approx((3 + 4 + 6 + 7 + 8) / 5)
    assert m["abo"] == pytest.approx((3 + 6) / 2)
    assert m["airw"] == pytest.approx((2 + 1) / 2)
    assert (m["think_blocks"], m["total_len"], m["reasoning_len"], m["response_len"]) == (2, 8, 3, 5)
    assert m["first_disclosure"] == 3
    texts = ["x", "y", "Sure", ",", "z", " the", " answer", " 7"]
    assert latency_metrics(ch, texts)["first_disclosure"] == 6  # "Sure," is only an acknowledgement
    starts_with_speech = latency_metrics([SPEAK, THINK, SPEAK])
    assert starts_with_speech["airw"] == pytest.approx(0.5) and starts_with_speech["abo"] == 2
    assert math.isnan(latency_metrics([THINK, THINK])["ari"])
    assert strip_acknowledgements("Okay, sure! The answer") == "the answer"


def _kkt_brute_force(s, c, eps):
    """Generic exact solver: enumerate active constraint sets, solve each equality QP, keep the KKT point."""
    G = len(s)
    A, b = [], []
    for i in range(G):  # a.R <= b form
        row = np.full(G, 1.0 / G)
        if c[i]:  # mean + eps - R_i <= 0
            row[i] -= 1.0
            A.append(row), b.append(-eps)
        else:  # R_i - mean + eps <= 0
            row = -row
            row[i] += 1.0
            A.append(row), b.append(-eps)
    A, b = np.array(A), np.array(b)
    best = None
    for k in range(G + 1):
        for act in itertools.combinations(range(G), k):
            Aa = A[list(act)]
            n = len(act)
            K = np.block([[2 * np.eye(G), Aa.T], [Aa, np.zeros((n, n))]]) if n else 2 * np.eye(G)
            rhs = np.concatenate([2 * np.asarray(s), b[list(act)]]) if n else 2 * np.asarray(s)
            try:
                sol = np.linalg.solve(K, rhs)
            except np.linalg.LinAlgError:
                sol = np.linalg.lstsq(K, rhs, rcond=None)[0]
            R, lam = sol[:G], sol[G:]
            if np.all(A @ R <= b + 1e-9) and np.all(lam >= -1e-9):
                val = float(np.sum((R - s) ** 2))
                if best is None or val < best[0]:
                    best = (val, R)
    return best[1]


def test_shaping_qp_is_exact_and_separates():
    rng = random.Random(0)
    for _ in range(40):
        G = rng.randint(2, 7)
        correct = [rng.random() < 0.5 for _ in range(G)]
        if all(correct) or not any(correct):
            correct[0] = not correct[0]
        longest = [rng.randint(5, 200) for _ in range(G)]
        s = shaping_targets(longest, correct)
        r = solve_shaping_qp(s, correct, eps=0.5)
        check_separation(r, correct, eps=0.5)
        assert r.mean() == pytest.approx(s.mean(), abs=1e-9)
        assert np.allclose(r, _kkt_brute_force(s, correct, 0.5), atol=1e-7)
    # eq. 14: correct ones by shorter longest-think (z-scores), incorrect at -S_min (S_min = 3)
    s = shaping_targets([10, 50, 90, 40], [True, True, True, False], s_min=3.0)
    assert s == pytest.approx([math.sqrt(1.5), 0.0, -math.sqrt(1.5), -3.0])
    r = solve_shaping_qp(s, [True, True, True, False])
    # by hand: mean(R) = mean(S) = -0.75, correct >= -0.25, incorrect <= -1.25; the shift t solves
    # (sqrt(1.5) + t) - 0.25 - 0.25 + (-3 + t) = -3, so t = (0.5 - sqrt(1.5)) / 2 and two correct are clamped
    t = (0.5 - math.sqrt(1.5)) / 2
    assert r == pytest.approx([math.sqrt(1.5) + t, -0.25, -0.25, -3.0 + t])
    with pytest.raises(ValueError, match="S_min must be > 0"):
        shaping_targets([1, 2], [True, False], s_min=0.0)
    with pytest.raises(ValueError, match="mixed group"):
        solve_shaping_qp([1.0, 2.0], [True, True])
    with pytest.raises(AssertionError, match="violate"):
        check_separation([1.0, 1.0], [True, False])


TAGS = {"think_open": 10, "think_close": 11, "speak_open": 12, "speak_close": 13}
EOS = 1


def test_channel_sampler_annotates_and_enforces_tag_structure():
    spec = {"kind": "sxs_channel", **TAGS}
    s = build_sampler(spec, 0)
    tokens = [10, 20, 21, 11, 12, 22, 13, 10, 23, 11, 12, 24, 13, EOS]
    notes = [s.on_token(t, RequestView("r", 0, [2], tokens[:i], EOS)) for i, t in enumerate(tokens)]
    channels = [n["channel"] for n in notes]
    assert channels == [THINK, THINK, THINK, THINK, SPEAK, SPEAK, SPEAK, THINK, THINK, THINK, SPEAK, SPEAK, SPEAK, THINK]
    assert visible_token_ids(tokens, channels, TAGS) == [22, 24]
    assert replay_annotations([spec], 0, [2], tokens, EOS) == notes
    fresh = build_sampler(spec, 0)
    logits = torch.zeros(30)
    outside = fresh.adjust(logits, None, RequestView("r", 0, [2], [], EOS)).logits
    assert set(torch.nonzero(outside > -math.inf).flatten().tolist()) == {10, 12, EOS}
    fresh.on_token(10, RequestView("r", 0, [2], [], EOS))
    inside = fresh.adjust(logits, None, RequestView("r", 0, [2], [10], EOS)).logits
    assert set(torch.nonzero(inside == -math.inf).flatten().tolist()) == {10, 12, 13, EOS}
    loose = build_sampler({**spec, "enforce": False}, 0)
    assert loose.adjust(logits, None, RequestView("r", 0, [2], [], EOS)).logits is None


# -- the interleaved data: a switch of the SxS section, applied by the generic data layer as a row transform ------
def test_interleaving_is_the_sxs_sections_switch_and_keys_the_caches(tmp_path):
    from slime_ext.config import load_config
    from slime_ext.methods.registry import data_transform
    from slime_ext.methods.sxs.interleave import interleave_row
    from slime_ext.orchestration.training_job import TrainingJob
    from slime_ext.tasks.prepare import prepare_data, transform_key
    from slime_ext.tasks.synthetic_math import generate_dataset
    from tests.conftest import CONFIGS
    from tests.methods.test_sxs_study import CharTokenizer

    small = [f"run.cache_dir={tmp_path}", "data.synthetic.n_train=12", "data.synthetic.n_eval=4"]

    def cfg(name, *overrides):
        return load_config(CONFIGS / name, [*small, *overrides]).config

    sft, rl, off, grpo = cfg("sxs_sft.yaml"), cfg("sxs_rl.yaml"), cfg("sxs_sft.yaml", "sxs.interleave_data=false"), \
        cfg("grpo.yaml")
    assert sft.sxs.interleave_data and rl.sxs.interleave_data and not hasattr(sft.data.synthetic, "sxs_interleave")
    assert data_transform(sft) is interleave_row and data_transform(rl) is interleave_row
    assert data_transform(off) is None and data_transform(grpo) is None
    assert transform_key(interleave_row) == "slime_ext.methods.sxs.interleave:interleave_row"

    # the prepared rows: the generator's rows interleaved (as before the switch moved), in a cache folder of their own
    on = prepare_data(sft.data, tmp_path, data_transform(sft))
    plain = prepare_data(off.data, tmp_path, data_transform(off))
    assert on.train_path.parent != plain.train_path.parent
    raw = generate_dataset(["L2"], 12, 0, "train")
    assert [r["solution"] for r in on.train] == [interleave_row(r)["solution"] for r in raw]
    assert [r["solution"] for r in plain.train] == [r["solution"] for r in raw]
    assert [r["prompt"] for r in on.train] == [r["prompt"] for r in raw]

    # the SFT warm start: the switch changes its key; SxS SFT and SxS RL share one (the study relies on it)
    def key(config):
        return TrainingJob(config, tmp_path, [], [], CharTokenizer(), tmp_path / "tok").warm_start_key()

    assert key(sft) == key(rl) != key(off)


# -- the v2 study's data settings: the answer after the reasoning (the control), and fewer disclosed steps --------
ROW = {"id": "r1", "prompt": "Ann has 5 pens. She buys 3 more. She gets 2 times as many as before. How many?",
       "label": "16", "solution": "Step 1: 5 + 3 = 8.\nStep 2: 8 * 2 = 16.\n\\boxed{16}\nCheck: 16 / 2 = 8. \\boxed{16}"}


def test_the_control_places_the_same_text_after_the_reasoning():
    from slime_ext.methods.sxs.interleave import SxSRows, interleave_row

    inter = interleave_row(ROW)["solution"]
    assert inter == ("<think>Step 1: 5 + 3 = 8.</think><speak>Let me work through it.\n\nAfter step 1 the count is 8."
                     "</speak><think>Step 2: 8 * 2 = 16.</think><speak>After step 2 the count is 16.\n\nSo the answer "
                     "is \\boxed{16}.</speak><think>Check: 16 / 2 = 8. \\boxed{16}</think>")
    after = SxSRows("after_reasoning")(ROW)
    assert after["solution"] == ("<think>Step 1: 5 + 3 = 8.\n\nStep 2: 8 * 2 = 16.</think><speak>Let me work through "
                                 "it.\n\nAfter step 1 the count is 8.\n\nAfter step 2 the count is 16.\n\nSo the answer "
                                 "is \\boxed{16}.</speak><think>Check: 16 / 2 = 8. \\boxed{16}</think>")
    assert after["cot_solution"] == ROW["solution"]

    def paragraphs(text):  # the words, without tags or where the blocks are cut
        return sorted(p for p in re.split(r"</?(?:think|speak)>|\n\n", text) if p)

    assert paragraphs(inter) == paragraphs(after["solution"])


def test_disclosure_share_reports_some_steps_drawn_from_the_row_id():
    from slime_ext.methods.sxs.interleave import SxSRows
    from slime_ext.methods.sxs.synthetic import disclosed_steps
    from slime_ext.tasks.synthetic_math import generate_dataset

    assert disclosed_steps("r1", 5, 1.0) == [0, 1, 2, 3, 4]
    assert disclosed_steps("r1", 5, 1e-9) == [4]  # the last step is always reported
    draws = [disclosed_steps(f"row{i}", 9, 0.5) for i in range(2000)]
    assert draws[:50] == [disclosed_steps(f"row{i}", 9, 0.5) for i in range(50)]  # the same on every build
    earlier = sum(len(d) - 1 for d in draws) / (2000 * 8)
    assert abs(earlier - 0.5) < 0.02  # 16000 Bernoulli(0.5) draws: SD 0.004
    with pytest.raises(ValueError, match="disclosure_share"):
        disclosed_steps("r1", 3, 0.0)

    # on v2 rows at share 0.5 the think blocks span one to several steps, so their number varies within a level
    rows = generate_dataset(["V8"], 200, seed=0, split="train", recheck_share=0.0)
    counts = [SxSRows(disclosure_share=0.5)(r)["solution"].count("<think>") for r in rows]
    full = {SxSRows()(r)["solution"].count("<think>") for r in rows}
    assert full == {8} and len(set(counts)) >= 4 and 2 <= min(counts) and max(counts) <= 8


def test_the_data_settings_are_validated_and_key_the_caches(tmp_path):
    from slime_ext.config import load_config
    from slime_ext.methods.registry import data_transform
    from slime_ext.methods.sxs.interleave import SxSRows, interleave_row
    from slime_ext.tasks.prepare import transform_key
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "sxs_sft.yaml", ["sxs.answer_placement=after_reasoning", "sxs.disclosure_share=0.5"]).config
    rows = data_transform(cfg)
    assert rows == SxSRows("after_reasoning", 0.5)
    keys = {transform_key(interleave_row), transform_key(rows), transform_key(SxSRows("interleaved", 0.5)),
            transform_key(SxSRows("after_reasoning"))}
    assert len(keys) == 4 and transform_key(SxSRows()) == transform_key(interleave_row)
    assert data_transform(load_config(CONFIGS / "sxs_sft.yaml", []).config) is interleave_row
    for bad, key in (("sxs.answer_placement=before", "answer_placement"), ("sxs.disclosure_share=0", "disclosure_share")):
        with pytest.raises(Exception, match=key):
            load_config(CONFIGS / "sxs_sft.yaml", [bad])
    with pytest.raises(Exception, match="sxs.disclosure_share = 0.5 shapes the interleaved SFT data"):
        load_config(CONFIGS / "sxs_rl.yaml", ["sxs.interleave_data=false", "sxs.disclosure_share=0.5"])


# -- latency in seconds of a streamed response --------------------------------------------------------------------
def test_seconds_metrics_by_hand():
    from slime_ext.methods.sxs.metrics import seconds_metrics, seconds_summary

    # a plain chain of thought: visible from the line of the last \boxed{, 0.9 s; "So" is an acknowledgement
    cot = [[0.1, "Step 1: 2 + 3"], [0.3, " = 5.\n"], [0.6, "\\boxed{4}\n"], [0.7, "Check"], [0.9, "\nSo "],
           [1.2, "\\boxed{5}"], [1.3, ""]]
    m = seconds_metrics(cot, speak_only=False)
    assert (m["first_visible_s"], m["first_disclosure_s"], m["total_s"]) == (0.9, 1.2, 1.3)
    # SxS's speak stream: everything visible; "Let me work through it." is not a disclosure
    sxs = [[0.2, "Let me work"], [0.25, " through it."], [0.5, "\n\nAfter step 1"], [0.8, ""]]
    s = seconds_metrics(sxs, speak_only=True)
    assert (s["first_visible_s"], s["first_disclosure_s"], s["total_s"]) == (0.2, 0.5, 0.8)
    nothing = seconds_metrics([[0.4, "Step 1: 7"], [0.5, ""]], speak_only=False)
    assert math.isnan(nothing["first_visible_s"]) and math.isnan(nothing["first_disclosure_s"]) and nothing["total_s"] == 0.5
    summary = seconds_summary([{"deltas": sxs}, {"deltas": [[0.3, "Okay."], [0.6, ""]]}], speak_only=True)
    assert summary["first_disclosure_s"] == 0.5 and summary["first_visible_s"] == pytest.approx(0.25)
    assert summary["total_s"] == pytest.approx(0.7) and summary["nothing_disclosed"] == 0.5
