"""DUET's gate: markers, the abort coin, tail-trim, replay; controller statistics; unbiased weights."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from sglang_patches.duet import DuetGateSampler, code_marker, gate_outcome, math_marker, qa_marker
from sglang_patches.request_sampler import RequestView, build_sampler, replay_annotations
from slime_ext.methods.duet.stats import LengthWindow, PromptStats, unbiasing_weight, within_step_sigma

EOS = 1
BOX, OPEN, CLOSE, X = 5, 6, 7, 8  # toy vocabulary: "\boxed", "{", "}", "x"
TEXT = {BOX: "\\boxed", OPEN: "{", CLOSE: "}", X: "x", EOS: ""}


def decode(ids):
    return "".join(TEXT.get(int(t), "?") for t in ids)


def spec(**kw):
    base = {"kind": "duet_gate", "k1": 4, "k2": 10, "grace": 6, "poll": 2, "window": 64, "eps_abort": 0.25}
    return base | kw


def drive(sampler, tokens, logits=None):
    """Feed tokens through adjust/on_token as a host would; stop where the sampler ends the request."""
    out, notes = [], []
    for t in tokens:
        view = RequestView("r", 0, [2], out, EOS, decode)
        action = sampler.adjust(logits if logits is not None else torch.zeros(10), None, view)
        if action.finish:
            out.append(EOS)
            notes.append(sampler.on_token(EOS, RequestView("r", 0, [2], out[:-1], EOS, decode)))
            break
        notes.append(sampler.on_token(t, view))
        out.append(t)
    return out, notes


# -- markers ---------------------------------------------------------------------------------------
def test_markers():
    assert math_marker("so \\boxed{12}") and math_marker("\\boxed{\\frac{1}{2}}")
    assert not math_marker("\\boxed{\\frac{1}{2}") and not math_marker("boxed 12")
    assert code_marker("x\n```python\nprint(1)\n```") and not code_marker("```python\nprint(1)\n")
    assert not code_marker("x\n  ```\n  ```")  # fences must start at column 0
    assert qa_marker("<answer>Paris</answer>") and qa_marker("Therefore the answer is 42.")
    assert not qa_marker("<answer>Paris") and not qa_marker("the answer is")


# -- the gate --------------------------------------------------------------------------------------
def test_marker_is_polled_only_from_k1_every_poll_tokens_and_then_trims_by_grace():
    s = build_sampler(spec(), seed=0)
    tokens = [BOX, OPEN, X, CLOSE] + [X] * 30  # marker complete at token 4 (n=4: k1=4, 4 % 2 == 0)
    high_entropy = torch.zeros(10)  # uniform: never trims by entropy
    out, notes = drive(s, tokens, high_entropy)
    assert notes[3].get("duet_marker") == 4
    assert out[-1] == EOS and len(out) == 4 + 6 + 1  # EOS forced at tau + grace
    s2 = build_sampler(spec(k1=6), seed=0)
    _, notes2 = drive(s2, tokens[:8], high_entropy)
    assert notes2[5].get("duet_marker") == 6  # not seen before k1; found at the first poll after it


def test_low_entropy_step_after_the_marker_ends_the_rollout():
    s = build_sampler(spec(), seed=0)
    confident = torch.full((10,), -30.0)
    confident[X] = 30.0
    out, _ = drive(s, [BOX, OPEN, X, CLOSE] + [X] * 30, confident)
    assert out == [BOX, OPEN, X, CLOSE, EOS]


def test_no_marker_by_k2_plus_grace_aborts_with_probability_one_minus_eps():
    aborted, kept = 0, 0
    for seed in range(400):
        s = build_sampler(spec(), seed=seed)
        out, notes = drive(s, [X] * 40, torch.zeros(10))
        did_abort, propensity, marker = gate_outcome(notes)
        assert marker is None
        if did_abort:
            aborted += 1
            assert out[-1] == EOS and len(out) == 10 + 6 + 1 and propensity == 0.0
        else:
            kept += 1
            assert len(out) == 40 and propensity == 0.25
    share = kept / 400
    assert abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 400)


def test_decisions_replay_from_seed_and_tokens():
    s = build_sampler(spec(), seed=11)
    out, notes = drive(s, [X] * 12 + [BOX, OPEN, X, CLOSE] + [X] * 30, torch.zeros(10))
    assert replay_annotations([spec()], 11, [2], out, EOS, decode) == notes


def test_bad_gate_parameters():
    with pytest.raises(ValueError, match="task"):
        DuetGateSampler(0, k1=1, k2=2, task="poetry")
    with pytest.raises(ValueError, match="k1 <= k2"):
        DuetGateSampler(0, k1=5, k2=2)


# -- controller statistics -------------------------------------------------------------------------
def test_k1_k2_converge_to_the_window_quantiles():
    rng = np.random.default_rng(0)
    window = LengthWindow(max_len=2000, size=1024, refit_every=10)
    assert (window.k1, window.k2) == (600, 1400)  # cold start 0.3 / 0.7 L_max
    for step in range(200):
        window.add(rng.exponential(300.0, size=64).astype(int))
        window.end_step()
    # exponential(300): p30 = -300 ln 0.7 = 107, p80 = -300 ln 0.2 = 483
    assert window.k1 == pytest.approx(-300 * math.log(0.7), rel=0.12)
    assert window.k2 == pytest.approx(-300 * math.log(0.2), rel=0.12)
    clone = LengthWindow(max_len=2000)
    clone.load_state_dict(window.state_dict())
    assert (clone.k1, clone.k2, list(clone.window)) == (window.k1, window.k2, list(window.window))


def test_prompt_stats_floor_schedule_and_lengths():
    st = PromptStats(floor_cold=0.01, default_length=100.0)
    assert st.s("a") == 0.01 and st.L("a") == 100.0
    for i, sig in enumerate(np.linspace(0.1, 2.0, 20)):
        st.observe(f"p{i}", float(sig), [50 + i])
    st.observe("p0", 0.3, [70])
    assert st.sigma["p0"][0] == pytest.approx(0.2) and st.L("p0") == pytest.approx(60.0)
    assert st.s("cold") == 0.01 and st.L("cold") == pytest.approx(np.mean([60] + [50 + i for i in range(1, 20)]))
    st.end_epoch()
    floor = st.floor
    assert floor == pytest.approx(np.quantile([0.2] + list(np.linspace(0.1, 2.0, 20))[1:], 0.05))
    st.observe("p1", 100.0, [])
    st.end_epoch()
    assert st.floor == floor  # frozen after the first epoch
    assert within_step_sigma([1.0, -1.0], [-2.0, -4.0]) == pytest.approx(np.std([-2.0, 4.0]))
    assert within_step_sigma([1.0], [-2.0]) is None


def test_importance_weights_make_the_gradient_unbiased():
    """Toy policy: two prompts, each a softmax over 4 trajectory types; some types show no marker before
    the gate. DUET estimator: prompts get different rollout counts (stratified), no-marker rollouts are
    aborted w.p. 1 - eps (weight 0) or kept with weight 1 / eps. Its mean must equal the expectation of
    the natural-rollout estimator (same counts and stratification, nothing aborted) within 3 standard
    errors."""
    rng = np.random.default_rng(0)
    theta = [np.array([0.2, -0.4, 0.9, 0.0]), np.array([-0.3, 0.5, 0.1, 0.7])]
    reward = [np.array([1.0, 0.0, 2.0, -1.0]), np.array([0.5, 1.5, -0.5, 1.0])]
    marker = [np.array([1, 0, 1, 0]), np.array([0, 1, 1, 0])]
    counts, eps = [2, 6], 0.2

    def grad_logp(th, y):
        p = np.exp(th - th.max())
        p /= p.sum()
        g = -p
        g[y] += 1.0
        return g

    from slime_ext.methods.duet.allocation import stratification_factors

    s_pre = stratification_factors(counts)  # [0.5, 1.0]: clip(n / mean n, eps_pre, 1)
    # the natural-rollout estimator with the same allocation and stratification (no gate), exactly
    natural = []
    for q, (th, r) in enumerate(zip(theta, reward)):
        p = np.exp(th - th.max())
        p /= p.sum()
        per_rollout = sum(p[y] * r[y] * grad_logp(th, y) for y in range(4))
        natural.append(counts[q] / s_pre[q] * per_rollout)
    natural = np.concatenate(natural) / sum(counts)
    estimates = []
    for _ in range(20000):
        est = [np.zeros(4), np.zeros(4)]
        for q, (th, n) in enumerate(zip(theta, counts)):
            p = np.exp(th - th.max())
            p /= p.sum()
            for y in rng.choice(4, size=n, p=p):
                if marker[q][y]:
                    w = unbiasing_weight(False, 1.0, s_pre[q])
                else:
                    keep = rng.random() < eps
                    w = unbiasing_weight(not keep, eps if keep else 0.0, s_pre[q])
                est[q] += w * reward[q][y] * grad_logp(th, y)
        estimates.append(np.concatenate(est) / sum(counts))
    estimates = np.asarray(estimates)
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(len(estimates))
    assert np.all(np.abs(mean - natural) < 3 * se + 1e-12), (mean, natural, se)
    # and without the 1/eps weight the estimate is biased (the test can fail)
    assert unbiasing_weight(False, eps, 1.0) == pytest.approx(5.0) and unbiasing_weight(True, 0.0, 1.0) == 0.0
