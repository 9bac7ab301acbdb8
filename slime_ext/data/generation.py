"""What an engine is asked and answers: token ids in, token ids out, with logprobs and per-token
annotations. Shared by the engines, the rollout manager and methods that run their own generation
(DA-GRPO's evaluation), so it lives with the data model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from sglang_patches.decoding import SamplingParams

FINISH_FAILED = "failed"


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]  # prompt, or prompt + partial response + appended text (continuation)
    sampling: SamplingParams
    seed: int
    sampler_specs: list[dict[str, Any]] = field(default_factory=list)
    return_logprob: bool = True
    # record the top-k expert ids of every MoE layer for every token fed to the model (sglang's
    # GenerateReqInput.return_routed_experts); MoE engines only, for rollout routing replay (R3)
    return_routed_experts: bool = False


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
    # the engine's weight version when it answered (SGLang's meta_info.weight_version); None: not reported
    weight_version: Optional[str] = None
    served_by: Optional[str] = None  # which engine server answered (an engine pool sets it)
    # with return_routed_experts: int16 tensor [prompt_len + len(output_ids) - 1, num_moe_layers, top_k], the
    # engine's top-k expert ids for every token it fed (the prompt and every output token but the last);
    # row t is the routing of the forward at token t. None when not asked. See docs/routing-replay.md.
    routed_experts: Optional[Any] = None


def check_unique_rids(requests: list[GenerateRequest]) -> None:
    """Request ids key per-request state (samplers, abort) in every engine: they must be unique."""
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        dup = sorted({r for r in rids if rids.count(r) > 1})
        raise ValueError(f"request ids in one generate call must be unique; repeated: {dup[:5]}")
