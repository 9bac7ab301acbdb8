"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions` (SSE with `stream`), `/v1/models`.

Every request is admitted (bounded concurrency + queue, else 429), its body read within the byte limit,
validated, tokenised off the event loop, checked against the context length, then batched. Supported:
`n` (one sample per choice, seeds seed, seed+1, ...; not with `stream`), `logprobs` of the sampled tokens
(not top alternatives, not with `stream` or a request extension), `max_tokens: 0` (an empty completion,
finish_reason "length"), `seed` in int64/uint64; request extensions a method registers (SxS's `speak_only`:
the speak channel only), known by their body field.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateResult
from slime_ext.serving.body import parse_json_object, read_body
from slime_ext.serving.errors import APIError, bad_request
from slime_ext.serving.schemas import ChatRequest, CompletionRequest, parse
from slime_ext.serving.state import FINISH_OPENAI, ServerState
from slime_ext.serving.streaming import SSEResponse, TokenStream, generate_all

router = APIRouter()
OpenAIRequest = Union[ChatRequest, CompletionRequest]


def get_state(request: Request) -> ServerState:
    return request.app.state.serve


async def read_json(state: ServerState, request: Request) -> dict[str, Any]:
    """The body of a route that carries no prompt (weight updates, abort, flush): the control cap."""
    return parse_json_object(await read_body(request, state.max_control_bytes, state.config.body_timeout_s))


async def read_prompt_json(state: ServerState, request: Request) -> dict[str, Any]:
    """The body of a prompt route: capped by what a maximal prompt needs (or --max-request-bytes)."""
    return parse_json_object(await read_body(request, state.max_request_bytes, state.config.body_timeout_s))


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = get_state(request)
    card: dict[str, Any] = {"id": state.model_name, "object": "model", "owned_by": "slime_ext"}
    if state.context_length is not None:
        card["max_model_len"] = state.context_length
    return {"object": "list", "data": [card]}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _openai(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _openai(request, chat=False)


def _refuse_unsupported(state: ServerState, req: OpenAIRequest, chat: bool,
                        extension: Optional[tuple[str, Any]]) -> None:
    """Fields whose meaning this server cannot honour: a 400 saying so, never a silent drop."""
    n = req.n or 1
    if n > state.config.max_n:
        raise bad_request(f"n={n} is more than this server's limit of {state.config.max_n} choices", param="n")
    if n > 1 and req.stream:
        raise bad_request("n>1 is not supported with stream: true; request n=1 or drop stream", param="n")
    wants_logprobs = bool(req.logprobs) if chat else req.logprobs is not None
    if chat and req.top_logprobs:
        raise bad_request("top_logprobs is not supported: only the sampled tokens' logprobs are returned "
                          "(logprobs: true, top_logprobs: 0)", param="top_logprobs")
    if not chat and req.logprobs:
        raise bad_request(f"logprobs={req.logprobs} asks for top alternatives, which are not supported; "
                          f"logprobs: 0 returns the sampled tokens' logprobs", param="logprobs")
    if not chat and req.echo:
        raise bad_request("echo is not supported", param="echo")
    if wants_logprobs and req.stream:
        raise bad_request("logprobs are not supported with stream: true", param="logprobs")
    if wants_logprobs and extension is not None:
        raise bad_request(f"logprobs are not supported with {extension[0]}", param="logprobs")


async def _prompt_ids(state: ServerState, req: OpenAIRequest, chat: bool) -> list[int]:
    if chat:
        text = state.render_chat(req.messages)
    elif isinstance(req.prompt, list) and req.prompt and all(type(t) is int for t in req.prompt):
        return state.check_ids(req.prompt, "prompt")
    elif isinstance(req.prompt, str):
        text = req.prompt
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", param="prompt")
    return await asyncio.to_thread(state.encode, text)  # tokenising a large prompt must not block the loop


def _sampling(req: Union[OpenAIRequest, Any], max_new: int) -> SamplingParams:
    stop = req.stop or []
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
        max_new_tokens=max_new, stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=list(req.stop_token_ids or []))


async def _openai(request: Request, chat: bool) -> Response:
    state = get_state(request)
    release = await state.admission.acquire()
    try:
        req = parse(ChatRequest if chat else CompletionRequest, await read_prompt_json(state, request))
        state.check_model(req.model)
        extension = state.active_extension(req.model_extra)  # e.g. SxS's speak_only (the method registry)
        _refuse_unsupported(state, req, chat, extension)
        ids = await _prompt_ids(state, req, chat)
        param = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
        max_new = state.token_budget(len(ids), getattr(req, param), param)
        with state.lock:
            state.openai_requests += 1
        view = extension[1] if extension is not None else None  # what the user sees of each answer
        specs = [view.sampler_spec(req.model_extra)] if view is not None else None
        reqs = [] if max_new == 0 else [
            state.request(ids, _sampling(req, max_new), state.seed(req.seed, i), specs) for i in range(req.n or 1)]
        out = _Reply(state, req, chat, len(ids))
        if req.stream:
            stream = TokenStream(state.batcher, reqs[0]) if reqs else None
            release_slot = release

            def on_close() -> None:
                if stream is not None:
                    stream.close()
                release_slot()

            response = SSEResponse(out.events(stream, view), on_close)
            release = None  # the response owns the slot now
            return response
        results = await generate_all(state.batcher, request, reqs) if reqs else [None] * (req.n or 1)
        return JSONResponse(out.body(results, view))
    finally:
        if release is not None:
            release()


class _Reply:
    """Shapes engine results as OpenAI chat / text completions, whole or as chunks."""

    def __init__(self, state: ServerState, req: OpenAIRequest, chat: bool, prompt_tokens: int):
        self.state, self.req, self.chat, self.prompt_tokens = state, req, chat, prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        self.created = int(time.time())

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.state.model_name,
                "choices": choices}

    def body(self, results: list[Optional[GenerateResult]], view: Any) -> dict[str, Any]:
        choices, completion_tokens = [], 0
        for i, res in enumerate(results):
            if res is None:  # max_tokens: 0
                text, finish, logprobs = "", "length", self._logprobs([], [])
            else:
                text = view.visible_text(res) if view is not None else self.state.completion_text(res)
                finish = FINISH_OPENAI.get(res.finish_reason, "stop")
                logprobs = self._logprobs(res.output_ids, res.logprobs or [])
                completion_tokens += len(res.output_ids)
            choice: dict[str, Any] = {"index": i, "finish_reason": finish, "logprobs": logprobs}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": self.prompt_tokens + completion_tokens}
        return body

    def _logprobs(self, output_ids: list[int], logprobs: list[float]) -> Optional[dict[str, Any]]:
        """The sampled tokens' log-probabilities under the policy at temperature 1 (eos left out)."""
        wanted = bool(self.req.logprobs) if self.chat else self.req.logprobs is not None
        if not wanted:
            return None
        tok = self.state.tokenizer
        pairs = [(t, lp) for t, lp in zip(output_ids, logprobs) if t != tok.eos_token_id]
        texts = [tok.decode([t], skip_special_tokens=False) for t, _ in pairs]
        if self.chat:
            return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                                for s, (_, lp) in zip(texts, pairs)]}
        offsets, at = [], 0
        for s in texts:
            offsets.append(at)
            at += len(s)
        return {"tokens": texts, "token_logprobs": [lp for _, lp in pairs], "top_logprobs": None,
                "text_offset": offsets}

    def _chunk(self, delta: str, finish: Optional[str]) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {"content": delta} if delta or finish is None else {}
        else:
            choice["text"] = delta
        return f"data: {json.dumps(self._envelope('chat.completion.chunk' if self.chat else 'text_completion', [choice]))}\n\n"

    async def events(self, stream: Optional[TokenStream], view: Any) -> AsyncIterator[str]:
        if stream is None:  # max_tokens: 0
            yield self._chunk("", "length")
            yield "data: [DONE]\n\n"
            return
        tok = self.state.tokenizer
        emitted, ids = "", []
        channel = view.tracker() if view is not None else None
        async for t in stream:
            if t == tok.eos_token_id or (channel is not None and not channel(t)):
                continue  # eos, or a private (think) token or tag: not streamed
            ids.append(t)
            text = tok.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte
                continue
            delta, emitted = text[len(emitted):], text
            if delta:
                yield self._chunk(delta, None)
        try:
            res = stream.result()
        except Exception as exc:  # noqa: BLE001 - the status line is sent: report in-band
            err = APIError(500, f"generation failed: {type(exc).__name__}: {exc}", type="server_error")
            yield f"data: {json.dumps(err.body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        final = tok.decode(ids, skip_special_tokens=True)
        if final.startswith(emitted) and len(final) > len(emitted):  # bytes held back at the end
            yield self._chunk(final[len(emitted):], None)
        yield self._chunk("", FINISH_OPENAI.get(res.finish_reason, "stop"))
        yield "data: [DONE]\n\n"
