"""DUET on Tandem rollouts (`configs/duet_tandem.yaml`): both samplers on one request, and the trainer's
per-token loss = DUET weight x advantage x (senior-only AND not-aborted mask) / kept senior tokens."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_patches.duet import gate_outcome
from sglang_patches.request_sampler import replay_annotations
from sglang_patches.decoding import SamplingParams
from slime_ext.config import load_config
from slime_ext.data import Sample
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.methods.duet_tandem.method import DuetTandem
from slime_ext.methods.registry import build_method
from tests.conftest import CONFIGS
from tests.megatron_fixtures import tiny_tandem_model

EOS, BOXED = 1, 20  # token 20 decodes to a whole "\boxed{7}": the math marker
BOUNDARY = list(range(10, 40))
K1, K2, GRACE = 4, 10, 4
TANDEM = {"kind": "tandem", "p_senior": 0.5, "kappa": 4, "boundary_ids": BOUNDARY}
GATE = {"kind": "duet_gate", "k1": K1, "k2": K2, "grace": GRACE, "poll": 2, "window": 64, "eps_abort": 0.5,
        "task": "math", "trim_entropy": 0.3}


def decode(ids, skip_special_tokens: bool = False) -> str:
    return "".join("\\boxed{7}" if int(t) == BOXED else ("" if int(t) == EOS else "x") for t in ids)


class Tokenizer:
    """Enough of a tokenizer for the rollout manager and the tandem boundary set (64-token vocabulary)."""

    eos_token_id = EOS

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3] + [40 + ord(c) % 20 for c in text[-6:]]}

    decode = staticmethod(decode)

    def get_vocab(self) -> dict[str, int]:
        return {("\u0120" if i in BOUNDARY else "") + f"t{i}": i for i in range(64)}


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return tiny_tandem_model(0), tiny_tandem_model(1)


def _cfg(*overrides):
    return load_config(CONFIGS / "duet_tandem.yaml", list(overrides)).config


def _requests(specs, n=24):
    sp = SamplingParams(temperature=1.0, max_new_tokens=40)
    prompts = [[5, 6, 7], [8, 9], [41, 42, 43, 44], [45]]
    return [GenerateRequest(f"t{i}", prompts[i % 4], sp, seed=i, sampler_specs=specs) for i in range(n)]


# -- engine: both samplers on one request ---------------------------------------------------------
def test_gate_and_tandem_on_one_request_compose(pair):
    """[tandem, duet_gate] on the real engine with senior + junior: every token keeps its tandem author
    (the same authors and tokens as tandem alone, up to where the gate ends the request), and the gate
    aborts at k2 + G + 1 / trims at tau + G + 1 exactly as it does alone."""
    senior, junior = pair
    both = EmbeddedEngine(senior, EOS, partner=junior, decode=decode).generate(_requests([TANDEM, GATE]))
    alone = EmbeddedEngine(senior, EOS, partner=junior, decode=decode).generate(_requests([TANDEM]))
    outcomes = {"aborted": 0, "eps_kept": 0, "trimmed": 0, "natural": 0}
    for req, res, ref in zip(_requests([TANDEM, GATE]), both, alone):
        notes = res.annotations
        assert len(notes) == len(res.output_ids) and all({"author", "author_drawn"} <= n.keys() for n in notes)
        did_abort, propensity, marker = gate_outcome(notes)
        if res.finish_reason == "sampler":  # the gate ended it: same tokens and authors, then a forced EOS
            n = len(res.output_ids)
            assert res.output_ids[:-1] == ref.output_ids[:n - 1] and res.output_ids[-1] == EOS
            assert [a["author"] for a in notes[:-1]] == [a["author"] for a in ref.annotations[:n - 1]]
            if did_abort:
                outcomes["aborted"] += 1
                assert n == K2 + GRACE + 1 and propensity == 0.0 and marker is None
            else:
                outcomes["trimmed"] += 1
                assert marker is not None and n <= marker + GRACE + 1
        else:  # never cut: exactly the tandem-only rollout, annotations a superset of tandem's
            assert res.output_ids == ref.output_ids
            assert [{k: a[k] for k in ("author", "author_drawn")} for a in notes] == ref.annotations
            outcomes["eps_kept" if propensity == 0.5 else "natural"] += 1
        # both samplers' decisions replay from seed + tokens (how SGLang recovers them)
        assert replay_annotations(req.sampler_specs, req.seed, req.input_ids, res.output_ids, EOS, decode) == notes
    assert all(v > 0 for v in outcomes.values()), outcomes  # every path of the gate was exercised
    junior_tokens = sum(a["author"] == 0 for r in both for a in r.annotations)
    assert junior_tokens > 20  # and the junior really wrote part of them


# -- method + trainer side ------------------------------------------------------------------------
def _sample(sid, group, text, authors, logprobs, notes, finish="stop"):
    n = len(authors)
    notes = [dict(x, author=a, author_drawn=i == 0) for i, (x, a) in enumerate(zip(notes, authors))]
    return Sample(sid, [3], list(range(10, 10 + n)), group_id=group, label="7", response_text=text,
                  logprobs=logprobs, metadata={"annotations": notes, "finish_reason": finish, "row_id": group})


def test_duet_tandem_masks_weights_and_per_token_loss():
    """Hand-made rollouts of two prompts through DuetTandem.finish (which folds the author weights into the
    masks) and the trainer's loss functions: per-token gradient = -w * A * [senior] * [not aborted] / (kept
    senior tokens)."""
    from slime_ext.algo.losses import grpo_per_token_loss, loss_coefficients

    cfg = _cfg()
    method = build_method(cfg, Tokenizer())
    assert isinstance(method, DuetTandem) and method.name == "duet_tandem"
    plans = method.plan([{"prompt": "q", "label": "7", "row_id": "g1"}, {"prompt": "r", "label": "7", "row_id": "g2"}], 0)
    assert [s["kind"] for s in plans[0].sampler_specs] == ["tandem", "duet_gate"]  # tandem first
    blank, keep, abort = {}, {"did_abort": False, "keep_propensity": 0.25}, {"did_abort": True, "keep_propensity": 0.0}
    g1 = [_sample("a", "g1", "\\boxed{7}", [1, 0, 1, 1, 0], [-1.0, -2.0, -1.0, -1.0, -3.0], [blank] * 5),
          _sample("b", "g1", "\\boxed{3}", [1, 1, 0, 1, 1], [-0.5] * 5, [blank] * 3 + [keep, blank]),
          _sample("c", "g1", "xx", [0, 1, 1, 0, 1], [-0.5] * 5, [blank] * 3 + [abort, blank], "sampler")]
    g2 = [_sample("d", "g2", "\\boxed{7}", [1, 1, 0, 1], [-0.2] * 4, [blank] * 4),
          _sample("e", "g2", "\\boxed{1}", [0, 1, 1, 1], [-0.2] * 4, [blank] * 4)]
    metrics = method.finish([g1, g2], 0)
    samples = g1 + g2
    assert [s.author for s in samples] == [[1, 0, 1, 1, 0], [1, 1, 0, 1, 1], [0, 1, 1, 0, 1], [1, 1, 0, 1], [0, 1, 1, 1]]
    # GRPO baseline over all rollouts, aborted included (sample std): g1 rewards 1,0,0; g2 1,0
    a_hi, a_lo, a_2 = (2 / 3) / (math.sqrt(1 / 3) + 1e-6), (-1 / 3) / (math.sqrt(1 / 3) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)
    assert [s.advantage for s in samples] == pytest.approx([a_hi, a_lo, 0.0, a_2, -a_2], rel=1e-5)
    # s_pre from counts 3 and 2 (mean 2.5): 1 and 0.8; b was eps-kept with propensity 0.25; c aborted
    w = [1.0, 4.0, 0.0, 1.25, 1.25]
    assert [s.weight for s in samples] == pytest.approx(w)
    loss = method.loss_spec()
    from slime_ext.orchestration.plan import build_plan

    assert build_plan(cfg).rollout.models_per_engine == 2  # engines hold the junior too
    masks = [s.loss_mask for s in samples]  # junior_weight 0: the method trains the senior's tokens only
    senior_only = [[1, 0, 1, 1, 0], [1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 1, 1]]
    assert masks == senior_only
    # the loss as the trainer computes it (ratio 1): d loss / d logprob per token
    T = 5

    def pad(rows):
        return torch.tensor([list(r) + [0.0] * (T - len(r)) for r in rows])

    old = pad([s.logprobs for s in samples])
    lp = old.clone().requires_grad_(True)
    mask = pad([[float(x) for x in m] for m in masks])
    adv = torch.tensor([s.advantage for s in samples])[:, None].expand(-1, T)
    weights = torch.tensor([s.weight for s in samples])[:, None].expand(-1, T)
    per_token, _ = grpo_per_token_loss(lp, old, adv, weights)
    coef, denom = loss_coefficients(mask, loss.loss_agg)
    ((per_token * coef).sum() / denom).backward()
    n_kept_senior = 3 + 4 + 0 + 3 + 3
    expected = [[-wi * s.advantage * m / n_kept_senior for m in row] + [0.0] * (T - len(row))
                for wi, s, row in zip(w, samples, senior_only)]
    torch.testing.assert_close(lp.grad, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    # sigma_q from the trained (senior) tokens of the kept rollouts a, b: sums -3 and -2
    assert method.stats.sigma["g1"][0] == pytest.approx(abs(a_hi * -3.0 - a_lo * -2.0) / 2, rel=1e-5)
    assert metrics["duet/abort_rate"] == pytest.approx(0.2) and metrics["tandem/senior_token_share"] == pytest.approx(16 / 23)


def test_duet_tandem_rollout_step_end_to_end(pair):
    """One step through the rollout manager on the real engine (senior + junior): every sample carries
    its authors and DUET's outcome; the trainer mask is senior-only and empty for aborted rollouts."""
    from slime_ext.orchestration.rollout_manager import RolloutManager

    senior, junior = pair
    cfg = _cfg("rollout.max_response_len=40", "rollout.n_samples_per_prompt=4", "rollout.prompts_per_step=6",
               "duet.grace=4", "duet.poll=2", "duet.eps_abort=0.5")
    rows = [{"prompt": f"q{i}", "label": "7", "row_id": i} for i in range(6)]
    engine = EmbeddedEngine(senior, EOS, partner=junior, decode=decode)
    manager = RolloutManager(cfg, rows, Tokenizer(), engine)
    groups, metrics = manager.rollout(0)
    samples = [s for g in groups for s in g]
    k2 = metrics["duet/k2"]
    assert k2 == 28 and metrics["duet/planned_tokens"] <= metrics["duet/budget_tokens"]
    masks = [s.loss_mask for s in samples]  # author weights folded in by the method
    aborted = [s for s in samples if s.metadata["did_abort"]]
    assert aborted and len(aborted) < len(samples)
    for s, m in zip(samples, masks):
        assert len(s.author) == s.response_len
        if s.metadata["did_abort"]:
            assert s.response_len == k2 + 4 + 1 and s.weight == 0.0 and s.advantage == 0.0 and sum(m) == 0
        else:
            assert m == [float(a == 1) for a in s.author] and s.weight > 0
    assert 0 < metrics["tandem/senior_token_share"] < 1
