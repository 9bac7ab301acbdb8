"""SGLang's native routes: `/generate` (token ids in, `output_ids` + `meta_info` out, GenerateReqInput
fields), `/abort_request`, `/flush_cache`, `/health`, so `SGLangEngineClient` drives this server exactly
like an SGLang server. Same admission and limits as the OpenAI routes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slime_ext.data.generation import GenerateResult
from slime_ext.serving.errors import bad_request
from slime_ext.serving.openai_routes import _sampling, get_state, read_json
from slime_ext.serving.schemas import AbortBody, GenerateBody, NativeSampling, parse
from slime_ext.serving.streaming import generate_all

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


def _decode_specs(value: Any) -> list[dict[str, Any]]:
    """`custom_params.sampler_specs` as SGLangEngineClient sends it (a JSON list of specs). Not
    sglang_adapter.decode_specs: importing that module imports sglang, seconds on the event loop."""
    try:
        specs = json.loads(value) if isinstance(value, str) else value
    except (ValueError, RecursionError):
        specs = None
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise bad_request("custom_params.sampler_specs must be a JSON list of sampler specs",
                          param="sampling_params.custom_params")
    return specs


@router.post("/generate")
async def generate(request: Request) -> Response:
    state = get_state(request)
    async with state.admission.slot():
        body = parse(GenerateBody, await read_json(state, request))
        if body.stream:
            raise bad_request("stream: true is not supported on /generate", param="stream")
        if body.input_ids is None and body.text is not None:
            raise bad_request("/generate takes token ids ('input_ids'), not 'text'", param="text")
        if not body.input_ids:
            raise bad_request("/generate needs 'input_ids': a non-empty list of token ids", param="input_ids")
        ids = state.check_ids(body.input_ids, "input_ids")
        sp = body.sampling_params or NativeSampling()
        max_new = state.token_budget(len(ids), sp.max_new_tokens, "sampling_params.max_new_tokens")
        seed = state.seed(sp.sampling_seed)
        specs = None
        custom = sp.custom_params or {}
        if custom.get("sampler_specs"):
            specs = _decode_specs(custom["sampler_specs"])
            state.check_specs(specs, seed)
        req = state.request(ids, _sampling(sp, max(max_new, 1)), seed, specs, rid=body.rid)
        if max_new == 0:  # nothing to generate: SGLang answers an empty output finished by length
            res = GenerateResult(req.rid, [], [], "length", [], 0, len(ids))
        else:
            (res,) = await generate_all(state.batcher, request, [req])
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": {"type": res.finish_reason if res.finish_reason != "sampler" else "stop"},
            "prompt_tokens": len(ids), "completion_tokens": len(res.output_ids), "cached_tokens": res.cached_tokens,
        }
        if body.return_logprob:
            meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(res.logprobs or [], res.output_ids)]
        return JSONResponse({"text": state.completion_text(res), "output_ids": res.output_ids, "meta_info": meta})


@router.post("/abort_request")
async def abort_request(request: Request) -> dict[str, Any]:
    """Abort by rid (queued requests are dropped, running ones stop at their next step) or all of them."""
    state = get_state(request)
    body = parse(AbortBody, await read_json(state, request))
    if body.abort_all:
        return {"success": True, "aborted": state.batcher.abort_all()}
    if not body.rid:
        raise bad_request("/abort_request needs 'rid' (or 'abort_all': true)", param="rid")
    return {"success": True, "aborted": state.batcher.abort(body.rid)}


@router.post("/flush_cache")
async def flush_cache(request: Request) -> dict[str, bool]:
    state = get_state(request)
    await read_json(state, request)
    flush = getattr(state.engine, "flush_cache", None)  # the exact solver has no cache
    if flush is not None:
        flush()
    return {"success": True}
