"""The engine interface shared by the embedded engine and the SGLang client.

Engines take token ids and return token ids (never re-tokenising between turns: prefix caches only hit
on identical ids), with per-token logprobs and the annotations the request's samplers produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol

import torch

from sglang_patches.sampling import SamplingParams

FINISH_FAILED = "failed"


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]  # prompt, or prompt + partial response + appended text (continuation)
    sampling: SamplingParams
    seed: int
    sampler_specs: list[dict[str, Any]] = field(default_factory=list)
    return_logprob: bool = True


@dataclass
class GenerateResult:
    rid: str
    output_ids: list[int]
    logprobs: Optional[list[float]]  # policy log-probability of each output token (temperature 1)
    finish_reason: str  # stop | length | abort | sampler | failed
    annotations: list[dict[str, Any]]  # one dict per output token (author, channel, flags ...)
    cached_tokens: int  # prompt tokens served from the prefix cache
    prompt_len: int
    error: Optional[str] = None


def check_unique_rids(requests: list[GenerateRequest]) -> None:
    """Request ids key per-request state (samplers, abort) in every engine: they must be unique."""
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        dup = sorted({r for r in rids if rids.count(r) > 1})
        raise ValueError(f"request ids in one generate call must be unique; repeated: {dup[:5]}")


class RolloutEngine(Protocol):
    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]: ...

    def abort(self, rid: str) -> None: ...

    def flush_cache(self) -> None: ...

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def release_memory_occupation(self) -> None: ...

    def resume_memory_occupation(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...
