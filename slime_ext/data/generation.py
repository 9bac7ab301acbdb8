"""What an engine is asked and answers: token ids in, token ids out, with logprobs and per-token
annotations. Shared by the engines, the rollout manager and methods that run their own generation
(DA-GRPO's evaluation), so it lives with the data model."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

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
    # requests with one affinity key go to the engine that served the key before (an engine pool keeps the
    # choice), so a multi-turn episode's later turns find its earlier turns in that engine's prefix cache;
    # None: grouped by input ids. Never sent to a server.
    affinity: Optional[str] = None
    # the LoRA adapter to serve it with (SGLang's lora_path: a name loaded by /load_lora_adapter_from_tensors);
    # None: the base model
    lora_name: Optional[str] = None


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
    # the weight version of every output token, where the engine reports it (SGLang's meta_info.weight_versions
    # spans: a request that went on across a weight update, paused in place or retracted, holds several)
    token_versions: Optional[list[str]] = None
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


def encode_routed_experts_b64(routed: torch.Tensor) -> str:
    """SGLang's wire form of `meta_info.routed_experts`: base64 of the int32 array [tokens, layers, top_k]
    (C order, native little-endian), tokens = prompt + output - 1 (every token the engine fed)."""
    import base64

    return base64.b64encode(routed.to(torch.int32).contiguous().numpy().astype("<i4").tobytes()).decode("ascii")


def decode_routed_experts_b64(value: Any, tokens: int, top_k: Optional[int], rid: str = "?") -> torch.Tensor:
    """`meta_info.routed_experts` -> int16 tensor [tokens, layers, top_k] (tokens = prompt + output - 1). The
    wire carries no shape: the array is split by the token count and the model's experts per token."""
    import base64

    import numpy as np

    if value is None:
        raise ValueError(f"request {rid!r} asked for routed experts but meta_info has none "
                         "(an SGLang server needs --enable-return-routed-experts)")
    if not top_k:
        raise ValueError("decoding routed experts needs the model's experts per token: give the client moe_top_k")
    arr = np.frombuffer(base64.b64decode(value), dtype="<i4")
    if tokens <= 0 or arr.size % (tokens * top_k):
        raise ValueError(f"request {rid!r}: routed_experts holds {arr.size} ids, not {tokens} tokens x layers x "
                         f"top-{top_k}")
    return torch.from_numpy(arr.astype(np.int16)).view(tokens, -1, top_k)


def continuation_seed(seed: int, generated: int) -> int:
    """The seed of a request continued after `generated` tokens (a partial rollout resumed after a weight
    sync): a pure function of the request's seed and the cut, so a rerun draws the same; not the original
    seed, whose stream would repeat the draws of the first tokens."""
    digest = hashlib.blake2b(f"continue:{seed}:{generated}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF


def continuation_request(request: GenerateRequest, generated: list[int]) -> Optional[GenerateRequest]:
    """`request` continued after `generated` tokens (a request cut by a weight sync): prompt + those tokens as
    the input, the rest of its token budget, the same rid, samplers and flags, a seed derived from its own and
    the cut; None when the budget is spent."""
    left = request.sampling.max_new_tokens - len(generated)
    if left < 1:
        return None
    return dataclasses.replace(request, input_ids=list(request.input_ids) + list(generated),
                               sampling=dataclasses.replace(request.sampling, max_new_tokens=left),
                               seed=continuation_seed(request.seed, len(generated)))


def version_spans(per_token: list[str]) -> list[dict[str, Any]]:
    """Per-token versions as SGLang's meta_info.weight_versions: [{"version", "start", "end"}] over the output."""
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(per_token):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def versions_from_spans(spans: Any, n_tokens: int, rid: str) -> list[str]:
    """SGLang's meta_info.weight_versions back to one version per output token; spans must tile [0, n_tokens)."""
    out: list[str] = []
    for span in spans:
        start, end, version = int(span["start"]), int(span["end"]), str(span["version"])
        if start != len(out) or end < start:
            raise ValueError(f"request {rid!r}: weight_versions spans {spans!r} do not tile the output")
        out += [version] * (end - start)
    if len(out) != n_tokens:
        raise ValueError(f"request {rid!r}: weight_versions spans cover {len(out)} tokens of {n_tokens}")
    return out
