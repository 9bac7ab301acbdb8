"""DUET on Tandem rollouts: DUET's token budget, Neyman allocation and marker-gated abort
(docs/methods/duet.md) over rollouts that a trained senior and a frozen junior co-generate
(docs/methods/tandem.md).

Engine side: every request carries both samplers, tandem first: `[tandem, duet_gate]`. The tandem
sampler hands on the current author's logits; the gate sees those (its entropy trim looks at the
distribution the token is drawn from) and may end the request with a forced EOS. Every emitted token,
a forced EOS included, passes through both samplers' `on_token`: it gets its author and the gate counts
it. The two annotate disjoint keys (`author`, `author_drawn` / `duet_marker`, `did_abort`,
`keep_propensity`), so `SamplerChain` merges them, and both replay from seed + tokens (SGLang).

Trainer side: DUET gives aborted rollouts advantage 0, an all-zero mask and weight 0, and kept ones the
weight 1 / (s_pre p_keep); Tandem's `finish` then multiplies each mask by the author weight (senior 1,
junior `tandem.junior_weight`, spliced text 0), so the loss is the token mean over the
senior's tokens of kept rollouts, each token weighted by its rollout's DUET weight. sigma_q, DUET's
informativeness, sums log-probabilities over the trained (author-weighted) tokens only. Both models
decode every token, so a rollout costs its full length in the budget whoever wrote it.
"""

from __future__ import annotations

from slime_ext.data import Sample, author_weights
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.duet.method import Duet
from slime_ext.methods.tandem.method import Tandem


class DuetTandem(Tandem, Duet):
    """MRO: DuetTandem -> Tandem -> Duet -> GRPO. `finish` is Tandem's (copy the authors, fail closed)
    around Duet's (gate outcomes, shared baseline, masks, weights, controller state); `update` and the
    controller state are Duet's; `plan` is Duet's allocation with the tandem spec put first."""

    name = "duet_tandem"

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        plans = Duet.plan(self, prompts, step)
        for p in plans:
            p.sampler_specs = [dict(self.spec)] + list(p.sampler_specs)
        return plans

    def trained_logprob_sum(self, sample: Sample) -> float:
        if sample.author is None or sample.logprobs is None:
            return 0.0
        by_author = author_weights(self.config.tandem.junior_weight)
        return sum(lp * by_author[int(a)] for lp, a in zip(sample.logprobs, sample.author))
