"""Tandem RL: the author state machine, two models in lockstep, and the senior-only loss."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang_patches.request_sampler import RequestView, build_sampler
from sglang_patches.decoding import SamplingParams
from sglang_patches.tandem import (JUNIOR, SENIOR, TandemSampler, author_runs, boundary_ids_from_vocab,
                                   check_same_vocabulary)
from slime_ext.data import Author, Sample
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from tests.megatron_fixtures import tiny_moe_config, tiny_tandem_model

EOS = 1
BOUNDARY = list(range(10, 40))  # a third of the tiny vocabulary is "word-initial"


@pytest.fixture(scope="module")
def senior():
    torch.set_num_threads(1)
    return tiny_tandem_model(0)


@pytest.fixture(scope="module")
def junior():
    return tiny_tandem_model(1)


def spec(p: float = 0.5, kappa: int = 4) -> dict:
    return {"kind": "tandem", "p_senior": p, "kappa": kappa, "boundary_ids": BOUNDARY}


def tandem_requests(n: int, p: float = 0.5, kappa: int = 4, max_new: int = 24, base_seed: int = 0):
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    prompts = [[5, 6, 7], [8, 9], [41, 42, 43, 44], [45]]
    return [GenerateRequest(f"t{i}", prompts[i % 4], sp, seed=base_seed + i, sampler_specs=[spec(p, kappa)])
            for i in range(n)]


def replay(tokens: list[int], seed: int, p: float = 0.5, kappa: int = 4) -> list[dict]:
    sampler = build_sampler(spec(p, kappa), seed)
    return [sampler.on_token(t, RequestView("r", seed, [5], tokens[:i], EOS)) for i, t in enumerate(tokens)]


# -- the state machine ----------------------------------------------------------------------------
def test_boundary_set_comes_from_the_word_initial_marker():
    vocab = {"\u0120the": 0, "the": 1, "\u0120a": 2, "!": 3, "\u01201": 4}
    assert boundary_ids_from_vocab(vocab) == [0, 2, 4]
    sp_vocab = {"\u2581hello": 0, "lo": 1, "\u2581x": 2}
    assert boundary_ids_from_vocab(sp_vocab) == [0, 2]
    with pytest.raises(ValueError, match="word-initial marker"):
        boundary_ids_from_vocab({"a": 0, "b": 1})


def test_switches_happen_only_after_a_boundary_token_or_kappa_tokens():
    rng = random.Random(0)
    kappa = 5
    for seed in range(200):
        tokens = [rng.randrange(2, 64) for _ in range(40)]
        notes = replay(tokens, seed, kappa=kappa)
        since = 0
        for t in range(1, len(tokens)):
            since += 1
            redraw = tokens[t - 1] in BOUNDARY or since >= kappa
            if redraw:
                since = 0
            # a fresh draw is recorded exactly at the token after a boundary or after kappa tokens
            assert notes[t]["author_drawn"] == redraw
            if notes[t]["author"] != notes[t - 1]["author"]:
                assert redraw, f"seed {seed}: author switched at {t} without a boundary or kappa"
        assert notes[0]["author_drawn"]


def test_kappa_forces_a_redraw_in_a_run_without_boundaries():
    tokens = [50] * 20  # never a boundary token
    notes = replay(tokens, seed=3, kappa=6)
    assert [i for i, n in enumerate(notes) if n["author_drawn"]] == [0, 6, 12, 18]


def test_authorship_is_a_function_of_the_seed_and_tokens_only():
    tokens = [12, 50, 51, 13, 52, 53, 54, 55, 56, 14, 60] * 3
    assert replay(tokens, 7) == replay(tokens, 7)
    assert any(replay(tokens, s) != replay(tokens, 7) for s in range(8, 14))


def test_state_survives_a_pause_and_serialisation():
    """A request not scheduled for a while resumes with its state (the reference code rebuilt it)."""
    tokens = [12, 50, 51, 13, 52, 53, 54, 55, 56, 14, 60, 61, 62, 15, 63]
    whole = replay(tokens, 11)
    first = build_sampler(spec(), 11)
    notes = [first.on_token(t, RequestView("r", 11, [5], tokens[:i], EOS)) for i, t in enumerate(tokens[:6])]
    second = build_sampler(spec(), 999)  # a different seed: everything must come from the state
    second.load_state_dict(first.state_dict())
    notes += [second.on_token(t, RequestView("r", 11, [5], tokens[:6 + i], EOS)) for i, t in enumerate(tokens[6:])]
    assert notes == whole


def test_adjust_returns_the_authors_logits_and_needs_the_partner():
    s = TandemSampler(0, p_senior=0.5, kappa=4, boundary_ids=BOUNDARY)
    own, partner = torch.zeros(8), torch.ones(8)
    view = RequestView("r", 0, [5], [], EOS)
    s.author_next = SENIOR
    assert s.adjust(own, partner, view).logits is None  # the host's own (senior) logits
    s.author_next = JUNIOR
    assert torch.equal(s.adjust(own, partner, view).logits, partner)
    with pytest.raises(RuntimeError, match="no partner logits"):
        s.adjust(own, None, view)


def test_bad_parameters_are_clear_errors():
    with pytest.raises(ValueError, match="p_senior"):
        TandemSampler(0, p_senior=1.5, boundary_ids=BOUNDARY)
    with pytest.raises(ValueError, match="exactly one of"):
        TandemSampler(0)


def test_vocabularies_must_match():
    check_same_vocabulary({"a": 0, "b": 1}, {"a": 0, "b": 1})
    with pytest.raises(ValueError, match="different ids: \\['a', 'b'\\]"):
        check_same_vocabulary({"a": 0, "b": 1}, {"a": 1, "b": 0})
    with pytest.raises(ValueError, match="only in junior: \\['c'\\]"):
        check_same_vocabulary({"a": 0}, {"a": 0, "c": 1})


def test_author_runs():
    assert author_runs([1, 1, 0, 0, 0, 1]) == [(1, 2), (0, 3), (1, 1)]
    assert author_runs([]) == []


# -- two models in lockstep -----------------------------------------------------------------------
def test_each_token_is_sampled_from_its_authors_distribution(senior, junior):
    """Engine logprobs are the senior's; junior-authored tokens must be likely under the junior."""
    engine = EmbeddedEngine(senior, EOS, partner=junior)
    results = engine.generate(tandem_requests(8))
    checked = {SENIOR: 0, JUNIOR: 0}
    for req, res in zip(tandem_requests(8), results):
        ids = torch.tensor([req.input_ids + res.output_ids])
        with torch.no_grad():
            lp_s = torch.log_softmax(senior(ids).logits[0], -1)
            lp_j = torch.log_softmax(junior(ids).logits[0], -1)
        for t, (tok, note) in enumerate(zip(res.output_ids, res.annotations)):
            pos = len(req.input_ids) - 1 + t
            assert res.logprobs[t] == pytest.approx(float(lp_s[pos, tok]), abs=1e-4)  # senior's logprob
            checked[note["author"]] += 1
    assert checked[SENIOR] > 10 and checked[JUNIOR] > 10
    # the same requests with the roles' models swapped give different tokens: authorship matters
    swapped = EmbeddedEngine(junior, EOS, partner=senior).generate(tandem_requests(8))
    assert [r.output_ids for r in swapped] != [r.output_ids for r in results]


def test_authorship_does_not_depend_on_the_batch(senior, junior):
    engine = EmbeddedEngine(senior, EOS, partner=junior)
    batch = engine.generate(tandem_requests(6))
    alone = [engine.generate([r])[0] for r in tandem_requests(6)]
    assert [r.output_ids for r in batch] == [r.output_ids for r in alone]
    assert [r.annotations for r in batch] == [r.annotations for r in alone]
    for req, res in zip(tandem_requests(6), batch):  # and it is the replay of seed + tokens
        assert res.annotations == replay(res.output_ids, req.seed)


def test_senior_share_of_draws_and_tokens_is_near_p(senior):
    """Self-paired (junior = senior's copy): the draw share is Binomial(p); the token share too, up to
    the correlation of tokens within a run (a loose bound)."""
    p = 0.3
    engine = EmbeddedEngine(senior, EOS, partner=senior)
    results = engine.generate(tandem_requests(48, p=p, kappa=4, max_new=32))
    drawn = [n["author"] for r in results for n in r.annotations if n["author_drawn"]]
    tokens = [n["author"] for r in results for n in r.annotations]
    share = sum(drawn) / len(drawn)
    assert len(drawn) > 300
    assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / len(drawn))
    assert abs(sum(tokens) / len(tokens) - p) < 0.08


def test_weight_updates_never_touch_the_junior(senior, junior):
    engine = EmbeddedEngine(tiny_tandem_model(0), EOS, partner=tiny_tandem_model(1))
    before = {k: v.clone() for k, v in engine.partner.state_dict().items()}
    new = {k: v + 0.01 for k, v in engine.model.state_dict().items()}
    engine.update_weights_from_tensor(new.items())
    assert all(torch.equal(engine.model.state_dict()[k], new[k]) for k in new)
    assert all(torch.equal(engine.partner.state_dict()[k], before[k]) for k in before)


def test_a_tandem_request_on_an_engine_without_junior_is_refused(senior):
    with pytest.raises(ValueError, match="partner model"):
        EmbeddedEngine(senior, EOS).generate(tandem_requests(1))


# -- the method and the trainer side --------------------------------------------------------------
def test_method_copies_authors_and_fails_closed(tmp_path):
    from slime_ext.config import load_config
    from slime_ext.methods.registry import build_method
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "tandem.yaml", []).config

    class Vocab:
        def get_vocab(self):
            return {"\u0120a": 0, "b": 1, "\u0120c": 2}

    method = build_method(cfg, Vocab())
    (plan,) = method.plan([{"prompt": "x"}], 0)
    assert plan.sampler_specs == [{"kind": "tandem", "p_senior": 0.5, "kappa": 32, "boundary_ids": [0, 2]}]
    notes = [{"author": 1, "author_drawn": True}, {"author": 0, "author_drawn": True}, {"author": 0, "author_drawn": False}]
    good = Sample("a", [3], [5, 6, 7], group_id="g", label="7", response_text="\\boxed{7}",
                  metadata={"annotations": notes})
    other = Sample("b", [3], [5, 6, 7], group_id="g", label="7", response_text="\\boxed{8}",
                   metadata={"annotations": notes})
    m = method.finish([[good, other]], 0)
    assert good.author == [1, 0, 0] and m["tandem/senior_token_share"] == pytest.approx(1 / 3)
    assert m["tandem/senior_draw_share"] == 0.5 and m["tandem/handoffs_per_rollout"] == 1.0
    bare = Sample("c", [3], [5, 6], group_id="h", label="1", response_text="1")
    with pytest.raises(ValueError, match="without per-token authors"):
        method.finish([[bare]], 0)


@pytest.fixture(scope="module")
def _parallel_state():
    from tests.megatron_fixtures import single_process_parallel_state

    single_process_parallel_state(seed=3)


def _trainer():
    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings

    settings = TrainerSettings(lr=1e-12, micro_batch_size=3, clip_grad=0.0)
    return MegatronTrainer(tiny_moe_config(), settings, ParallelSizes())


def _folded(samples: list[Sample], junior_weight: float) -> list[Sample]:
    """The masks Tandem's `finish` hands the trainer: author weights folded into `loss_mask`."""
    from slime_ext.methods.tandem.method import fold_author_weights

    fold_author_weights(samples, junior_weight)
    return samples


def _grads(trainer):
    return {n: p.main_grad.detach().clone() for n, p in trainer.model.module.named_parameters()}


def _tandem_samples(seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(6):
        r = rng.randint(4, 9)
        authors = [rng.choice([0, 1]) for _ in range(r - 1)] + [int(Author.PARTNER)]  # last token: junior
        out.append(Sample(f"s{i}", [rng.randrange(2, 64) for _ in range(3)], [rng.randrange(2, 64) for _ in range(r)],
                          logprobs=[rng.uniform(-3, 0) for _ in range(r)], author=authors,
                          advantage=float(rng.choice([-1.0, 1.0])), reward=0.0))
    return out


def test_loss_ignores_junior_tokens_exactly(_parallel_state):
    trainer = _trainer()
    samples = _folded(_tandem_samples(), 0.0)
    first = trainer.train_step(samples, kind="grpo")
    grads_a = _grads(trainer)
    # perturb every junior token's old logprob and the last (junior) token's target
    changed = []
    for s in samples:
        lp = [x - 5.0 if a == 0 else x for x, a in zip(s.logprobs, s.author)]
        ids = s.response_ids[:-1] + [(s.response_ids[-1] + 7) % 64]
        changed.append(Sample(s.sample_id, s.prompt_ids, ids, logprobs=lp, author=s.author, advantage=s.advantage))
    second = trainer.train_step(_folded(changed, 0.0), kind="grpo")
    assert first["pg_loss"] == second["pg_loss"] and first["grad_norm"] == second["grad_norm"]
    assert all(torch.equal(grads_a[n], _grads(trainer)[n]) for n in grads_a)
    assert first["tokens"] == sum(sum(a == 1 for a in s.author) for s in samples)
    # and it equals plain GRPO with the junior tokens masked out by hand
    masked = [Sample(s.sample_id, s.prompt_ids, s.response_ids, logprobs=s.logprobs, advantage=s.advantage,
                     loss_mask=[float(a == 1) for a in s.author]) for s in samples]
    third = trainer.train_step(masked, kind="grpo")
    assert third["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-6)


def test_junior_weight_trains_junior_tokens_and_missing_authors_raise(_parallel_state):
    trainer = _trainer()
    zero = trainer.train_step(_folded(_tandem_samples(1), 0.0), kind="grpo")
    half_samples = _folded(_tandem_samples(1), 0.5)
    assert {m for s in half_samples for m, a in zip(s.loss_mask, s.author) if a == 0} == {0.5}
    half = trainer.train_step(half_samples, kind="grpo")
    assert half["grad_norm"] != pytest.approx(zero["grad_norm"], rel=1e-4)
    bare = [Sample(s.sample_id, s.prompt_ids, s.response_ids, logprobs=s.logprobs, advantage=s.advantage)
            for s in _tandem_samples(1)]
    with pytest.raises(ValueError, match="needs `author` on every sample"):
        _folded(bare, 0.0)


def test_partner_cache_that_missed_solo_requests_stays_aligned(senior, junior):
    """Solo requests run the policy alone (its prefix cache learns prompts the junior's cache lacks); a
    later tandem batch on overlapping prefixes must use one prefix length for both models."""
    engine = EmbeddedEngine(senior, EOS, partner=junior)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    engine.generate([GenerateRequest(f"solo{i}", [5, 6, 7, 8, 9 + i], sp, seed=i) for i in range(4)])
    reqs = tandem_requests(6)
    reqs = [GenerateRequest(r.rid, [5, 6, 7] + r.input_ids, r.sampling, r.seed, r.sampler_specs) for r in reqs]
    got = engine.generate(reqs)
    fresh = EmbeddedEngine(senior, EOS, partner=junior).generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in fresh]
    assert [r.annotations for r in got] == [r.annotations for r in fresh]
    again = engine.generate(reqs)  # now both caches hold these prompts: reused, same outputs
    assert any(r.cached_tokens > 0 for r in again)
    assert [r.output_ids for r in again] == [r.output_ids for r in fresh]
