"""Tandem RL ("Tandem RL", see docs/methods/tandem.md): senior and frozen junior co-generate; GRPO on
the senior's tokens only.

The engine side is `sglang_patches.tandem.TandemSampler` (one per request, partner model = junior);
this method plans those requests, copies the per-token authors onto the samples (failing closed when a
rollout has none), folds the author weights into `loss_mask` (senior 1, junior `tandem.junior_weight`,
spliced text 0) and logs the authorship statistics. `TandemKLReg` is the paper's KL-Reg baseline: solo
GRPO rollouts with a per-token KL(senior || junior) penalty, i.e. the GRPO KL term with the junior as
reference.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import mean
from typing import Any, Optional

from sglang_patches.tandem import author_runs, boundary_ids_from_vocab
from slime_ext.algo import LossSpec
from slime_ext.data import Author, Sample, author_weights
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo.method import GRPO
from slime_ext.tokenizer import checkpoint_with_vocabulary


def tandem_sampler_spec(config: Any, tokenizer: Any) -> dict[str, Any]:
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


def junior_dir(config: Any, tokenizer: Any, start_dir: Path) -> Path:
    """The frozen junior: `tandem.junior_path`, else the senior's starting checkpoint (self-paired). A
    different junior must share the senior's vocabulary exactly."""
    path = config.tandem.junior_path
    return checked_junior(path, tokenizer, "tandem.junior_path") if path else start_dir


def checked_junior(path: str, tokenizer: Any, key: str) -> Path:
    """The junior checkpoint `key` names: an HF checkpoint whose vocabulary is the senior's, exactly."""
    return checkpoint_with_vocabulary(path, tokenizer, key)


def fold_author_weights(samples: list[Sample], junior_weight: float) -> None:
    """Multiply each sample's `loss_mask` by its tokens' author weights (in place). Missing authors raise:
    a tandem batch must never silently train as plain GRPO."""
    lacking = [s.sample_id for s in samples if s.author is None]
    if lacking:
        raise ValueError(f"author-masked training (tandem) needs `author` on every sample; missing on "
                         f"{lacking[:5]} ({len(lacking)} of {len(samples)})")
    by_author = author_weights(junior_weight)
    for s in samples:
        s.loss_mask = [m * by_author[a] for m, a in zip(s.loss_mask, s.author)]


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

    def __init__(self, config: Any, tokenizer: Optional[Any] = None):
        super().__init__(config, tokenizer)
        self.spec = tandem_sampler_spec(config, tokenizer)

    def partner_dir(self, start_dir: Path) -> Optional[Path]:
        return junior_dir(self.config, self.tokenizer, start_dir)

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
        fold_author_weights(samples, self.config.tandem.junior_weight)
        metrics.update(authorship_metrics(samples))
        return metrics


class TandemKLReg(GRPO):
    """Solo rollouts; the trainer adds `tandem.klreg_beta` x KL(senior || junior) per token."""

    name = "tandem_klreg"

    def loss_spec(self) -> LossSpec:
        return dataclasses.replace(super().loss_spec(), kl_coef=self.config.tandem.klreg_beta)

    def kl_reference_dir(self, start_dir: Path) -> Optional[Path]:
        junior = junior_dir(self.config, self.tokenizer, start_dir)
        return junior if junior != start_dir else None
