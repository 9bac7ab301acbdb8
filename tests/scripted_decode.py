"""The embedded engine's per-token protocol (`EmbeddedEngine._decide`) for a scripted policy, shared by tests
that drive real samplers without a model: the request's SamplerChain adjusts, a forced token or finish wins over
the script, every emitted token (a forced EOS included) is annotated by `on_token`, then the stop checks run."""

from __future__ import annotations

from typing import Callable

import torch

from sglang_patches.decoding import StopChecker
from sglang_patches.request_sampler import RequestView, SamplerChain
from slime_ext.data.generation import GenerateResult


def decode_scripted(req, stream: list[int], logits: torch.Tensor, eos: int, decode: Callable[[list[int]], str],
                    logprob: float) -> GenerateResult:
    """One request decoded token by token from `stream` (the policy's tokens, EOS included)."""
    chain = SamplerChain.from_specs(req.sampler_specs, req.seed)
    stop = StopChecker(req.sampling, eos, decode)
    ids, notes, reason = [], [], None
    while reason is None:
        view = RequestView(req.rid, req.seed, req.input_ids, ids, eos, decode)
        action = chain.adjust(logits, None, view)
        token = action.force_token if action.force_token is not None else stream[len(ids)]
        notes.append(chain.on_token(token, view))
        ids.append(token)
        reason = "sampler" if action.finish else stop.check(ids)
    return GenerateResult(req.rid, ids, [logprob] * len(ids), reason, notes, 0, len(req.input_ids))
