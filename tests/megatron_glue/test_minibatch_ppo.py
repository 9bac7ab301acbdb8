"""Mini-batch PPO, trainer-recomputed old logprobs and the mismatch correction in the trainer (one process)."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_glue.model_provider import ParallelSizes
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from slime_ext.algo import LossSpec
from slime_ext.data import Sample
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config
from tests.megatron_glue.test_trainer import make_samples as trainer_samples


def make_trainer(**kw) -> MegatronTrainer:
    single_process_parallel_state(seed=3)
    settings = TrainerSettings(**({"lr": 1e-3, "micro_batch_size": 4, "clip_grad": 0.0} | kw))
    return MegatronTrainer(tiny_moe_config(), settings, ParallelSizes())


def make_samples(n: int = 8, seed: int = 0) -> list[Sample]:
    return trainer_samples(n, seed, min_response=4)


def with_engine_logprobs(samples: list[Sample], trainer: MegatronTrainer, shift=lambda i, t: 0.0) -> list[Sample]:
    """The samples with engine logprobs = the trainer's own, minus log(ratio) from `shift(sample, token)`."""
    lp = trainer.compute_logprobs(samples)["logprobs"]
    for i, s in enumerate(samples):
        s.logprobs = [float(v) - shift(i, t) for t, v in enumerate(lp[s.sample_id])]
    return samples


def params(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.module.named_parameters()}


def test_minibatches_equal_sequential_steps_with_their_own_denominators():
    """One call with global_batch_size 4 on 8 samples == two calls on samples 0-3 and 4-7 (engine old logprobs):
    the same two optimizer steps, each normalised by its own mini-batch."""
    samples = make_samples(8)
    split = make_trainer(global_batch_size=4)
    metrics = split.train_step(samples)
    assert metrics["optimizer_steps"] == 2 and split.step == 1
    seq = make_trainer()
    first, second = seq.train_step(samples[:4]), seq.train_step(samples[4:])
    a, b = params(split), params(seq)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert metrics["grad_norm"] == pytest.approx((first["grad_norm"] + second["grad_norm"]) / 2, rel=1e-5)
    # token means over the whole batch: each mini-batch's mean weighted by its token count
    total = first["tokens"] + second["tokens"]
    want = (first["pg_loss"] * first["tokens"] + second["pg_loss"] * second["tokens"]) / total
    assert metrics["pg_loss"] == pytest.approx(want, rel=1e-5) and metrics["tokens"] == total


def test_one_step_has_ratio_one_and_several_minibatches_clip():
    """A single optimizer step never clips (the ratio is 1 up to noise); four mini-batches at a large lr
    move the policy, so later mini-batches clip on both sides and drift from the old policy."""
    single = make_trainer(lr=0.05, old_logprobs="trainer")
    one = single.train_step(make_samples(16))
    assert one["clip_frac"] == 0.0 and one["approx_kl_old"] < 1e-12
    assert one["ratio/p00"] == pytest.approx(1.0, abs=1e-6) and one["ratio/p100"] == pytest.approx(1.0, abs=1e-6)
    multi = make_trainer(lr=0.05, old_logprobs="trainer", global_batch_size=4)
    four = multi.train_step(make_samples(16))
    assert four["optimizer_steps"] == 4
    assert four["clip_frac"] > 0.05 and four["approx_kl_old"] > 1e-3
    assert four["clip_frac"] == pytest.approx(four["clip_frac_low"] + four["clip_frac_high"], abs=1e-9)
    assert four["ratio/p00"] < 0.8 < 1.0 < 1.2 < four["ratio/p100"]
    assert four["ratio/p01"] <= four["ratio/p50"] <= four["ratio/p99"]


def test_clip_higher_changes_the_clip_fractions():
    """DAPO's eps_high 0.28 against GRPO's 0.2 on the same batches: fewer tokens clipped on the high side."""
    fractions = {}
    for eps_high in (0.2, 0.28):
        trainer = make_trainer(lr=0.05, old_logprobs="trainer", global_batch_size=4, loss=LossSpec(eps_clip_high=eps_high))
        fractions[eps_high] = trainer.train_step(make_samples(16))
    assert fractions[0.2]["clip_frac_high"] > fractions[0.28]["clip_frac_high"] > 0
    assert fractions[0.2]["clip_frac_low"] == pytest.approx(fractions[0.28]["clip_frac_low"], abs=0.1)


def test_recomputed_old_logprobs_are_the_trainers_and_mismatch_is_measured():
    """Engine logprobs planted at a known offset: the mismatch metrics report it exactly, and with trainer old
    logprobs the first mini-batch's ratio is exactly 1 whatever the engine said."""
    trainer = make_trainer(lr=1e-12, old_logprobs="trainer")
    samples = with_engine_logprobs(make_samples(6), trainer, shift=lambda i, t: 0.3 if t % 2 else -0.1)
    m = trainer.train_step(samples)
    tokens = [t for s in samples for t in range(s.response_len)]
    want_abs = sum(0.3 if t % 2 else 0.1 for t in tokens) / len(tokens)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(want_abs, abs=1e-5)
    assert m["mismatch/abs_diff_max"] == pytest.approx(0.3, abs=1e-5)
    want_kl = sum(math.exp(0.3) - 1.3 if t % 2 else math.exp(-0.1) - 0.9 for t in tokens) / len(tokens)
    assert m["mismatch/kl"] == pytest.approx(want_kl, rel=1e-3)
    assert m["approx_kl_old"] < 1e-12 and m["clip_frac"] == 0.0


def test_engine_old_logprobs_single_step_measures_mismatch_in_the_training_forward():
    trainer = make_trainer(lr=1e-12)
    samples = with_engine_logprobs(make_samples(6), trainer, shift=lambda i, t: 0.2)
    m = trainer.train_step(samples)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(0.2, abs=1e-5)
    # the engine's logprobs are the old policy here: ratio exp(0.2) everywhere
    assert m["ratio/p50"] == pytest.approx(math.exp(0.2), rel=1e-5)


@pytest.mark.parametrize("mode, scale", [("none", 1.0), ("truncate", 2.0), ("mask", 0.0)])
def test_mismatch_weights_scale_the_gradient_exactly(mode, scale):
    """Every token's ratio pi_old / pi_engine is 4: TIS (cap 2) doubles the gradient, IcePop's band [0.5, 2]
    drops every token, and no correction leaves it as it is."""
    trainer = make_trainer(lr=1e-12, old_logprobs="trainer", mismatch_mode=mode, mismatch_cap=2.0)
    samples = with_engine_logprobs(make_samples(6), trainer, shift=lambda i, t: math.log(4.0))
    reference = make_trainer(lr=1e-12, old_logprobs="trainer")
    base = reference.train_step(with_engine_logprobs(make_samples(6), reference))["grad_norm"]
    m = trainer.train_step(samples)
    assert m["grad_norm"] == pytest.approx(scale * base, rel=1e-5, abs=1e-12)
    if mode == "truncate":
        assert m["mismatch/truncated_frac"] == pytest.approx(1.0) and m["mismatch/weight_mean"] == pytest.approx(2.0)
    if mode == "mask":
        assert m["mismatch/masked_frac"] == pytest.approx(1.0) and m["mismatch/weight_mean"] == 0.0


def test_untrained_samples_are_left_out_of_the_minibatches():
    trainer = make_trainer(global_batch_size=2)
    samples = make_samples(8)
    for s in samples[::2]:  # a dropped group's samples: all-zero masks
        s.loss_mask = [0.0] * s.response_len
    chunks = trainer.minibatches(samples)
    assert [[s.sample_id for s in c] for c in chunks] == [["s1", "s3"], ["s5", "s7"]]
