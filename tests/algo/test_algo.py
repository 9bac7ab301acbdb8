"""GRPO core math against hand-computed values and closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from slime_ext.algo import (
    aggregate,
    entropy_from_logits,
    group_advantages,
    grouped_advantages,
    grpo_per_token_loss,
    kl_penalty,
    mean_at_k,
    pass_at_k,
    pass_at_k_over_prompts,
    ppo_clip_loss,
)


def test_group_advantage_hand_values():
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.8660254
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert torch.allclose(adv, torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254]), atol=1e-6)
    # population std is 0.5 -> +-1
    adv_pop = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0, unbiased_std=False)
    assert torch.allclose(adv_pop, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    # std normalisation off: centred rewards only
    assert torch.allclose(group_advantages([3.0, 1.0, 2.0], normalize_std=False), torch.tensor([1.0, -1.0, 0.0]))
    # [3,1,2]: mean 2, unbiased std 1, eps 1e-6
    assert torch.allclose(group_advantages([3.0, 1.0, 2.0]), torch.tensor([1.0, -1.0, 0.0]) / (1 + 1e-6))


def test_uniform_group_and_singleton_have_zero_advantage():
    assert torch.equal(group_advantages([1.0, 1.0, 1.0]), torch.zeros(3))
    assert torch.equal(group_advantages([0.7]), torch.zeros(1))


@pytest.mark.parametrize("normalize_std", [True, False])
def test_constant_group_that_float32_cannot_represent_has_exactly_zero_advantage(normalize_std):
    """0.2 is not a float32: the float32 mean of eight 0.2s is 0.20000002 and the old code gave every
    rollout -0.0147 (normalised). A group with no variance carries no signal: exactly 0."""
    for rewards in ([0.2] * 8, torch.full((8,), 0.2, dtype=torch.float32), [0.1] * 3 + [0.1]):
        assert torch.equal(group_advantages(rewards, normalize_std=normalize_std), torch.zeros(len(rewards)))
    # collab_grpo's fixed 0.2 assistance reward: a constant group next to a normal one in one batch
    adv = grouped_advantages([0.2] * 8 + [1.0, 0.0], [0] * 8 + [1, 1], normalize_std=normalize_std, eps=0.0)
    assert torch.equal(adv[:8], torch.zeros(8))
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70710678 = +-0.70710678
    want = torch.tensor([0.70710678, -0.70710678]) if normalize_std else torch.tensor([0.5, -0.5])
    assert torch.allclose(adv[8:], want, atol=1e-7)
    assert adv.dtype == torch.float32


def test_non_representable_rewards_keep_their_hand_values():
    # [0.2, 0.2, 0.2, 0.7]: mean 0.325, centred [-0.125] * 3 + [0.375], unbiased var 0.1875 / 3 -> std 0.25
    adv = group_advantages([0.2, 0.2, 0.2, 0.7], eps=0.0)
    assert torch.allclose(adv, torch.tensor([-0.5, -0.5, -0.5, 1.5]), atol=1e-7)


def test_grouped_advantages_respect_group_membership():
    rewards = [1.0, 5.0, 0.0, 7.0, 3.0, 5.0]
    groups = ["a", "b", "a", "b", "c", "c"]
    adv = grouped_advantages(rewards, groups, normalize_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -1.0, -0.5, 1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="group ids"):
        grouped_advantages([1.0, 2.0], ["a"])


@pytest.mark.parametrize(
    "ratio, adv, eps_low, eps_high, expected, was_clipped",
    [
        (1.5, 1.0, 0.2, 0.2, -1.2, 1.0),  # positive advantage, ratio above 1+eps: clipped
        (1.5, -1.0, 0.2, 0.2, 1.5, 0.0),  # negative advantage: the pessimistic unclipped term wins
        (0.5, 1.0, 0.2, 0.2, -0.5, 0.0),
        (0.5, -1.0, 0.2, 0.2, 0.8, 1.0),  # clipped at 1 - eps_low
        (1.5, 1.0, 0.2, 0.28, -1.28, 1.0),  # DAPO clip-higher
        (0.7, -2.0, 0.1, 0.28, 1.8, 1.0),  # -A*clip(0.7, 0.9, 1.28) = 2*0.9
        (1.1, 2.0, 0.2, 0.2, -2.2, 0.0),  # inside the trust region: plain ratio
    ],
)
def test_ppo_clip_hand_values(ratio, adv, eps_low, eps_high, expected, was_clipped):
    old = torch.tensor([-1.0])
    new = old + math.log(ratio)
    loss, clipped = ppo_clip_loss(new, old, torch.tensor([adv]), eps_low, eps_high)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert clipped.item() == was_clipped


def test_ppo_clip_gradient_is_zero_when_clipped():
    old = torch.tensor([0.0])
    new = torch.tensor([math.log(1.5)], requires_grad=True)
    loss, _ = ppo_clip_loss(new, old, torch.tensor([1.0]))
    loss.sum().backward()
    assert new.grad.item() == 0.0
    new2 = torch.tensor([math.log(1.1)], requires_grad=True)
    loss2, _ = ppo_clip_loss(new2, old, torch.tensor([1.0]))
    loss2.sum().backward()
    assert new2.grad.item() == pytest.approx(-1.1)  # d(-A r)/dlogp = -A r


def test_kl_estimators_hand_values():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    ln2 = math.log(2.0)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2)
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + ln2)
    # low_var_kl clamps a huge ratio where k3 explodes
    big = kl_penalty(torch.tensor([-60.0]), torch.tensor([0.0]), "low_var_kl")
    assert big.item() == pytest.approx(10.0)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")


def test_k1_and_k3_expectations_equal_exact_kl():
    """Under tokens drawn from pi, E[k1] = E[k3] = KL(pi || ref): check exactly over a vocabulary."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(50, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(50, dtype=torch.float64), 0)
    exact = (p * (p.log() - q.log())).sum()
    for kind in ("k1", "k3"):
        expectation = (p * kl_penalty(p.log(), q.log(), kind)).sum()
        assert expectation.item() == pytest.approx(exact.item(), rel=1e-9)
    # k2 is biased: its expectation differs
    assert (p * kl_penalty(p.log(), q.log(), "k2")).sum().item() != pytest.approx(exact.item(), rel=1e-3)


def test_entropy_closed_forms():
    uniform = torch.zeros(2, 8)
    assert torch.allclose(entropy_from_logits(uniform), torch.full((2,), math.log(8)))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)


def test_aggregation_token_vs_sample_mean():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(2.5)
    assert aggregate(values, mask, "sample_mean").item() == pytest.approx(3.0)
    # fractional mask (e.g. junior tokens at weight 0.5) weighs tokens
    assert aggregate(torch.tensor([[2.0, 4.0]]), torch.tensor([[1.0, 0.5]]), "token_mean").item() == pytest.approx(
        4.0 / 1.5
    )


def test_all_masked_gives_zero_not_nan():
    v = torch.tensor([[1.0, 2.0]], requires_grad=True)
    m = torch.zeros(1, 2)
    for mode in ("token_mean", "sample_mean"):
        out = aggregate(v, m, mode)
        assert out.item() == 0.0
        out.backward()


def _batch_loss(logp, old, adv, mask, **kw):
    """The trainer's reduction: per-token GRPO loss, token-mean over the mask (metrics likewise)."""
    per_token, parts = grpo_per_token_loss(logp, old, adv, **kw)
    return aggregate(per_token, mask), {name: float(aggregate(v, mask)) for name, v in parts.items()}


def test_grpo_loss_hand_value_with_weights_kl_entropy():
    # two samples, ratio 1 (on-policy): pg per token = -A * weight
    logp = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    weights = torch.tensor([[2.0, 2.0], [1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ref = torch.full((2, 2), math.log(0.5))  # k1 = log 2 per token
    ent = torch.tensor([[1.0, 1.0], [4.0, 4.0]])
    loss, metrics = _batch_loss(
        logp, logp, adv, mask, weights=weights, ref_logprobs=ref, entropy=ent,
        kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01,
    )
    pg = (-2.0 - 2.0 + 2.0) / 3.0  # tokens: -A*w = -2, -2, +2
    ent_mean = (1 + 1 + 4) / 3.0
    expected = pg + 0.1 * math.log(2.0) - 0.01 * ent_mean
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(pg, abs=1e-6)
    assert metrics["entropy"] == pytest.approx(ent_mean)
    assert metrics["clip_frac"] == 0.0
    with pytest.raises(ValueError, match="reference logprobs"):
        _batch_loss(logp, logp, adv, mask, kl_coef=0.1)


def test_grpo_gradient_direction_raises_good_tokens():
    """One step of gradient descent increases the logprob of the positive-advantage token."""
    logits = torch.zeros(1, 2, 5, requires_grad=True)
    targets = torch.tensor([[1, 3]])
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = _batch_loss(logp, logp.detach(), adv, torch.ones(1, 2))
    loss.backward()
    new_logits = logits.detach() - 1.0 * logits.grad
    new_logp = torch.log_softmax(new_logits, -1).gather(-1, targets[..., None])[..., 0]
    assert new_logp[0, 0] > logp[0, 0] and new_logp[0, 1] < logp[0, 1]


def test_pass_at_k_matches_closed_form():
    for n in range(1, 12):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                closed = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(100, 0, 10) == 0.0
    assert pass_at_k(1000, 999, 1) == pytest.approx(0.999)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_pass_at_k_is_monte_carlo_probability():
    """pass@k equals the frequency of 'some correct' over all k-subsets (exhaustive)."""
    import itertools

    outcomes = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        subsets = list(itertools.combinations(outcomes, k))
        freq = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(6, 2, k) == pytest.approx(freq)


def test_mean_at_k_and_over_prompts():
    scores = [[1, 0, 1, 1], [0, 0, 0, 1]]
    assert mean_at_k(scores, 4) == pytest.approx((0.75 + 0.25) / 2)
    assert mean_at_k(scores, 2) == pytest.approx((0.5 + 0.0) / 2)
    assert pass_at_k_over_prompts([(4, 3), (4, 1)], 1) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_at_k([[1]], 2)
