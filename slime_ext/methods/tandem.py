"""Tandem RL (METHODS.md section 1): senior and frozen junior co-generate; GRPO on senior tokens only.

The engine side is `sglang_patches.tandem.TandemSampler` (one per request, partner model = junior);
this method plans those requests, copies the per-token authors onto the samples (failing closed when a
rollout has none) and logs the authorship statistics. The trainer applies the author mask
(`TrainerSettings.junior_weight`). `TandemKLReg` is the paper's KL-Reg baseline: solo GRPO rollouts
with a per-token KL(senior || junior) penalty, i.e. the GRPO KL term with the junior as reference.
"""

from __future__ import annotations

from statistics import mean
from typing import Any, Optional

from sglang_patches.tandem import author_runs, boundary_ids_from_vocab
from slime_ext.config.schema import Config
from slime_ext.data import Author, Sample
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo import GRPO


def tandem_sampler_spec(config: Config, tokenizer: Any) -> dict[str, Any]:
    """The per-request sampler spec. SGLang workers load the boundary set from the tokenizer path (a
    Qwen3 vocabulary would make every request carry ~75k ids); the embedded engine gets the ids."""
    t = config.tandem
    spec: dict[str, Any] = {"kind": "tandem", "p_senior": t.p_senior, "kappa": t.kappa}
    if config.rollout.engine == "sglang":
        if not config.model.hf_path:
            raise ValueError("tandem on SGLang needs model.hf_path (the workers read the boundary set from its tokenizer)")
        spec["tokenizer_path"] = config.model.hf_path
    else:
        if tokenizer is None:
            raise ValueError("tandem on the embedded engine needs the tokenizer to build the boundary set")
        spec["boundary_ids"] = boundary_ids_from_vocab(tokenizer.get_vocab())
    return spec


def authorship_metrics(samples: list[Sample]) -> dict[str, float]:
    """Senior shares (of tokens and of author draws), handoffs per rollout and mean run length."""
    tokens = [a for s in samples for a in (s.author or [])]
    drawn = [a for s in samples for a, d in zip(s.author or [], s.metadata.get("author_drawn", [])) if d]
    runs = [author_runs(s.author or []) for s in samples]
    lengths = [n for r in runs for _, n in r]
    return {
        "tandem/senior_token_share": mean(a == Author.POLICY for a in tokens) if tokens else float("nan"),
        "tandem/senior_draw_share": mean(a == Author.POLICY for a in drawn) if drawn else float("nan"),
        "tandem/draws": float(len(drawn)),
        "tandem/handoffs_per_rollout": mean(max(len(r) - 1, 0) for r in runs) if runs else 0.0,
        "tandem/mean_run_length": mean(lengths) if lengths else 0.0,
    }


class Tandem(GRPO):
    name = "tandem"
    needs_partner = True

    def __init__(self, config: Config, tokenizer: Optional[Any] = None):
        super().__init__(config)
        self.spec = tandem_sampler_spec(config, tokenizer)

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        n = self.config.rollout.n_samples_per_prompt
        return [PromptPlan(n, self.sampling, [dict(self.spec)]) for _ in prompts]

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        samples = [s for g in groups for s in g]
        for s in samples:
            notes = s.metadata.get("annotations") or []
            if len(notes) != s.response_len or any("author" not in n for n in notes):
                raise ValueError(f"tandem rollout {s.sample_id!r} came back without per-token authors "
                                 f"({len(notes)} annotations for {s.response_len} tokens); is the engine running "
                                 "the tandem sampler with a junior model?")
            s.author = [int(n["author"]) for n in notes]
            s.metadata["author_drawn"] = [bool(n.get("author_drawn", False)) for n in notes]
        metrics = super().finish(groups, step)
        metrics.update(authorship_metrics(samples))
        return metrics


class TandemKLReg(GRPO):
    """Solo rollouts; the trainer adds `tandem.klreg_beta` x KL(senior || junior) per token."""

    name = "tandem_klreg"
