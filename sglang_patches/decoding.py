"""Plain sampling (what GRPO uses): temperature / top-p / top-k, stop ids, stop strings, max tokens.

The embedded engine uses `choose_token` and `StopChecker` directly; on SGLang the same parameters go in
`sampling_params` and SGLang's own sampler applies them (after our custom logit processor), so the two
hosts share one parameter set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 128
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # stop strings (matched on the decoded response)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def to_sglang(self) -> dict[str, Any]:
        """The same parameters in SGLang's `sampling_params` vocabulary."""
        out = asdict(self)
        if not out["stop"]:
            del out["stop"]
        return out


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits with top-k / top-p tails set to -inf (rows = requests, last dim = vocab)."""
    scaled = logits.float() / max(params.temperature, 1e-6)
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it is kept)
        drop = probs.cumsum(-1) - probs >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    return scaled


def _key(params: SamplingParams) -> tuple:
    return (params.temperature, params.top_p, params.top_k)


def choose_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[Optional[torch.Generator]]
) -> list[int]:
    """One token per row: greedy when temperature is 0, else inverse-CDF sampling with one uniform
    draw from each row's own generator. Rows sharing sampling parameters are filtered in one batch;
    the draw of a row depends only on its generator, never on the other rows."""
    tokens = [0] * logits.shape[0]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(_key(p), []).append(i)
    for key, rows in groups.items():
        group = logits if len(rows) == logits.shape[0] else logits[torch.tensor(rows, device=logits.device)]
        if key[0] == 0:
            picked = torch.argmax(group, dim=-1)
        else:
            probs = torch.softmax(filtered_logits(group, params[rows[0]]), dim=-1)
            cdf = probs.cumsum(-1)
            # the draws come from the rows' own (host) generators, so a row's token is the same on any device
            draws = torch.cat([torch.rand(1, generator=generators[i]) for i in rows]).to(cdf.device)
            u = draws.to(cdf.dtype) * cdf[:, -1]
            picked = torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
        for i, t in zip(rows, picked.tolist()):
            tokens[i] = int(t)
    return tokens


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    """`choose_tokens` for a single row (same arithmetic, so hosts agree token for token)."""
    return choose_tokens(logits[None], [params], [generator])[0]


class StopChecker:
    """Decides whether a response is finished after its latest token, and why."""

    def __init__(self, params: SamplingParams, eos_token_id: Optional[int],
                 decode: Optional[Callable[[Sequence[int]], str]] = None):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        if params.stop and decode is None:
            raise ValueError("stop strings need a tokenizer to decode the response")
        self.decode = decode
        self.tail_tokens = max((len(s) for s in params.stop), default=0) + 8

    def check(self, output_ids: Sequence[int]) -> Optional[str]:
        if output_ids and output_ids[-1] in self.stop_ids:
            return FINISH_STOP
        if self.params.stop:
            tail = self.decode(list(output_ids[-self.tail_tokens :]))
            if any(s in tail for s in self.params.stop):
                return FINISH_STOP
        if len(output_ids) >= self.params.max_new_tokens:
            return FINISH_LENGTH
        return None
