"""SGLang's native routes: `/generate` (token ids in, `output_ids` + `meta_info` out, GenerateReqInput
bodies validated as SGLang does, see `native_schemas`), `/abort_request`, `/pause_generation`,
`/continue_generation`, `/flush_cache`, `/health`, so
`SGLangEngineClient` drives this server exactly like an SGLang server. Same admission and limits as the
OpenAI routes. `meta_info.weight_version` is the version of the weights that generated the answer, and
`meta_info.weight_versions` (SGLang's spans) the version of every output token."""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.data.generation import encode_routed_experts_b64, version_spans
from slime_ext.serving.errors import APIError, bad_request
from slime_ext.serving.openai_routes import _sampling, get_state, read_json, read_prompt_json
from slime_ext.serving.native_schemas import (AbortReq, ContinueGenerationReqInput, GenerateItem, GenerateReqInput,
                                               PauseGenerationReqInput, SamplingParamsBody, check_sampling,
                                               generate_items)
from slime_ext.serving.schemas import parse
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


def _register_samplers(specs: list[dict[str, Any]], modules: Any) -> None:
    """Import the modules defining the specs' kinds (custom_params.sampler_modules, as SGLangEngineClient
    sends it; the SGLang adapter does the same): only modules a registered method declares."""
    from sglang_patches.request_sampler import SAMPLER_REGISTRY, import_sampler_modules

    if all(s.get("kind") in SAMPLER_REGISTRY for s in specs) or not modules:
        return
    try:
        import_sampler_modules(modules)
    except ValueError as exc:
        raise bad_request(f"custom_params.sampler_modules: {exc}", param="sampling_params.custom_params") from None


def _finish_reason(res: GenerateResult) -> dict[str, Any]:
    """SGLang's finish_reason object. A sampler that ended the request forced EOS, which SGLang reports
    as a matched stop token ({"type": "stop", "matched": EOS}); this server adds `"sampler": true`, so
    `SGLangEngineClient` returns finish reason "sampler" as the embedded engine does (DUET counts only
    natural "stop" ends in its length window)."""
    if res.finish_reason == "sampler":
        return {"type": "stop", "matched": res.output_ids[-1] if res.output_ids else None, "sampler": True}
    return {"type": res.finish_reason}


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    """One request, or a batch (SGLang's form: `input_ids` a list of prompts) answered with a list in the
    same order. A batch is validated whole (one bad row refuses it, naming the row, as SGLang does), then
    takes one admission slot per row, all at once, and its rows join the engine together."""
    state = get_state(request)
    asleep = getattr(state.engine, "memory_released", lambda: None)()
    if asleep:  # a client error, not an overload: nothing to retry until the trainer wakes the engine
        raise bad_request(asleep, code="memory_released")
    release = await state.admission.acquire()
    try:
        body = parse(GenerateReqInput, await read_prompt_json(state, request))
        items = generate_items(body)
        if len(items) > 1:  # the body was read under one slot; the batch runs under one per row
            release()
            release = await state.admission.acquire(len(items))
        prepared = [_prepare_row(state, body, item) for item in items]
        answers = await _run(state, request, prepared, items, body)
    finally:
        release()
    return JSONResponse(answers if isinstance(body.input_ids[0], list) else answers[0])


def _prepare_row(state: Any, body: GenerateReqInput, item: GenerateItem) -> tuple[GenerateRequest, int]:
    """`_prepare`, with a refusal of a batch row naming the row (`sampling_params[1].top_p`, "row 1: ...")."""
    try:
        return _prepare(state, body, item)
    except APIError as exc:
        if item.where and exc.param and exc.param.startswith("sampling_params."):
            exc.param = f"sampling_params{item.where}" + exc.param[len("sampling_params"):]
        if item.where:
            exc.message = f"row {item.where[1:-1]}: {exc.message}"
        raise


def _prepare(state: Any, body: GenerateReqInput, item: GenerateItem) -> tuple[GenerateRequest, int]:
    """The engine request of one row and its token budget; a 400 naming the row's field if it is invalid."""
    w = item.where
    ids = state.check_ids(item.input_ids, f"input_ids{w}")
    sp = parse(SamplingParamsBody, item.sampling_params, prefix=f"sampling_params{w}")
    check_sampling(sp, state.vocab_size)
    max_new = state.token_budget(len(ids), sp.max_new_tokens, f"sampling_params{w}.max_new_tokens")
    seed = state.seed(sp.sampling_seed)
    specs = None
    custom = sp.custom_params or {}
    if custom.get("sampler_specs"):
        specs = _decode_specs(custom["sampler_specs"])
        _register_samplers(specs, custom.get("sampler_modules"))
        state.check_specs(specs, seed)
    if body.return_routed_experts and (max_new == 0 or not hasattr(state.engine, "prefix_cache")):
        raise bad_request("'return_routed_experts' needs an embedded-engine MoE server and max_new_tokens > 0",
                          param="return_routed_experts")
    if item.logprob_start_len >= 0:
        if max_new > 0 or not item.return_logprob:
            raise bad_request(f"'logprob_start_len' is supported by this server for prefill-only scoring: "
                              f"max_new_tokens 0 with return_logprob true (row asks for {max_new} new tokens)",
                              param="logprob_start_len")
        if item.logprob_start_len >= len(ids) or not hasattr(state.engine, "score"):
            raise bad_request(f"logprob_start_len {item.logprob_start_len} must be a position of the {len(ids)} "
                              "input tokens, on an embedded-engine server", param="logprob_start_len")
    served = getattr(getattr(state.engine, "lora", None), "name", None)
    if item.lora_path != served:  # the engine serves one adapter, merged (slime_ext/engine/lora_merge.py)
        raise bad_request(f"lora_path {item.lora_path!r}: this server serves {served!r} (load an adapter with "
                          "/load_lora_adapter_from_tensors; one at a time)", param=f"lora_path{w}")
    req = state.request(ids, _sampling(sp, max(max_new, 1)), seed, specs, rid=item.rid,
                        return_routed_experts=body.return_routed_experts)
    req.lora_name = item.lora_path
    return req, max_new


async def _run(state: Any, request: Request, prepared: list[tuple[GenerateRequest, int]], items: list[GenerateItem],
               body: GenerateReqInput) -> list[dict[str, Any]]:
    """Generate every row that asks for tokens (together, so they share the engine's batch) and build
    SGLang's answer of each."""
    tickets = [state.batcher.submit(req) for req, max_new in prepared if max_new > 0]
    outputs = await generate_all(state.batcher, request, tickets=tickets) if tickets else []
    scoring = [(req.input_ids, item.logprob_start_len) for (req, _), item in zip(prepared, items)
               if item.logprob_start_len >= 0]
    scores = iter(await run_in_threadpool(_score, state, scoring) if scoring else [])
    done = {t.request.rid: (res, t.weight_version) for t, res in zip(tickets, outputs)}
    answers = []
    for (req, _), item in zip(prepared, items):
        # a row without tokens to generate: SGLang answers an empty output finished by length
        empty = (GenerateResult(req.rid, [], [], "length", [], 0, len(req.input_ids)), None)
        res, version = done.get(req.rid) or empty
        answer = _answer(state, body, req, res, version or state.weight_version, item.return_logprob)
        if item.logprob_start_len >= 0:
            answer["meta_info"]["input_token_logprobs"] = _input_logprobs(state, body, req.input_ids,
                                                                          item.logprob_start_len, next(scores))
        answers.append(answer)
    return answers


def _score(state: Any, rows: list[tuple[list[int], int]]) -> list[list[float]]:
    """The served model's logprob of every input token after each row's start (prefill only), with the engine
    to itself (its generate calls are the batcher's)."""
    with state.batcher.exclusive():
        return state.engine.score([ids for ids, _ in rows], [start + 1 for _, start in rows], "policy")


def _input_logprobs(state: Any, body: GenerateReqInput, ids: list[int], start: int,
                    logprobs: list[float]) -> list[list[Any]]:
    """SGLang's meta_info.input_token_logprobs from `start`: [logprob, token id, text] per input token, the first
    None (its logits, at the position before, are not computed)."""
    text = (lambda t: state.tokenizer.decode([t])) if body.return_text_in_logprobs else (lambda t: None)
    return [[lp, tok, text(tok)] for lp, tok in zip([None, *logprobs], ids[start:])]


def _answer(state: Any, body: GenerateReqInput, req: GenerateRequest, res: GenerateResult,
            version: Optional[str], return_logprob: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": req.rid, "finish_reason": _finish_reason(res),
        "prompt_tokens": len(req.input_ids), "weight_version": version, "completion_tokens": len(res.output_ids),
        "cached_tokens": res.cached_tokens,
    }
    if res.token_versions:  # SGLang's spans of the versions that produced the output (several across a pause)
        meta["weight_versions"] = version_spans(res.token_versions)
        meta["weight_version"] = res.token_versions[-1]
    if return_logprob:
        text = (lambda t: state.tokenizer.decode([t])) if body.return_text_in_logprobs else (lambda t: None)
        meta["output_token_logprobs"] = [[lp, tok, text(tok)] for lp, tok in zip(res.logprobs or [], res.output_ids)]
    if body.return_routed_experts and res.routed_experts is not None:
        # SGLang's encoding: base64 of int32 [prompt + output - 1, layers, top_k]
        meta["routed_experts"] = encode_routed_experts_b64(res.routed_experts)
    return {"text": state.completion_text(res), "output_ids": res.output_ids, "meta_info": meta}


@router.post("/abort_request")
async def abort_request(request: Request) -> dict[str, Any]:
    """Abort by rid (queued requests are dropped, running ones stop at their next step) or all of them.
    SGLang answers an empty 200; the count of aborted requests here is extra."""
    state = get_state(request)
    body = parse(AbortReq, await read_json(state, request))
    if body.abort_all:
        return {"success": True, "aborted": state.batcher.abort_all()}
    if not body.rid:  # SGLang turns a missing rid into "" and aborts nothing
        return {"success": True, "aborted": 0}
    return {"success": True, "aborted": state.batcher.abort(body.rid)}


@router.post("/pause_generation")
async def pause_generation(request: Request) -> dict[str, Any]:
    """SGLang's pause (`Batcher.pause`: abort, retract or in_place); answered once the requests it aborted or
    retracted have been told to stop. SGLang answers {"message", "status"}; the count is extra."""
    state = get_state(request)
    body = parse(PauseGenerationReqInput, await read_json(state, request))
    try:
        touched = state.batcher.pause(body.mode)
    except ValueError as exc:
        raise bad_request(str(exc), param="mode") from None
    return {"message": "Generation paused successfully.", "status": "ok", "requests": touched}


@router.post("/continue_generation")
async def continue_generation(request: Request) -> dict[str, Any]:
    state = get_state(request)
    parse(ContinueGenerationReqInput, await read_json(state, request))
    state.batcher.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


@router.post("/flush_cache")
async def flush_cache(request: Request) -> dict[str, bool]:
    state = get_state(request)
    await read_json(state, request)
    flush = getattr(state.engine, "flush_cache", None)  # the exact solver has no cache
    if flush is not None:
        flush()
    return {"success": True}
