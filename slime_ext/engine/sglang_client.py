"""The client of one SGLang server (or a router in front of several) as an engine: `generate` and the
control routes (abort, flush, weight updates, memory), with the same interface as the embedded engine.

SGLang surfaces used (sglang 0.5.21, `srt/entrypoints/http_server.py` and `srt/managers/io_struct.py`):
    POST /generate                          GenerateReqInput: {"rid", "input_ids", "sampling_params",
                                            "return_logprob", "custom_logit_processor"}; the response has
                                            "output_ids" (also with token-id input) and "meta_info" with
                                            "finish_reason" ({"type": stop|length|abort, ...}),
                                            "prompt_tokens", "cached_tokens", "output_token_logprobs"
                                            ([logprob, token_id, text|None] per output token)
    POST /abort_request                     AbortReq {"rid"} or {"abort_all": true}
    POST /flush_cache                       200 if flushed, 400 while requests are running
    POST /begin_weight_update, /end_weight_update    a weight-update session; in 0.5.21 both
                                            update_weights_from_tensor and update_weights_from_distributed
                                            fail outside one (weight_updater.py)
    POST /update_weights_from_tensor        {"serialized_named_tensors": [one base64 ForkingPickler blob
                                            per TP rank], "load_format", "flush_cache", "weight_version"}
    POST /init_weights_update_group         {"master_address", "master_port", "rank_offset", "world_size",
                                            "group_name", "backend"}
    POST /update_weights_from_distributed   {"names", "dtypes", "shapes", "group_name", "flush_cache", ...}
    POST /release_memory_occupation, /resume_memory_occupation   {"tags": [...] | null}
    GET  /health
The per-request seed goes to `sampling_params["sampling_seed"]` (SGLang reads it only under
`--enable-deterministic-inference`, and then needs `--sampling-backend pytorch` for top-p/top-k; without
it SGLang's draws are unseeded, while our samplers' coins still derive from the seed in custom_params). Per-token annotations cannot come back
through SGLang's response, so they are recomputed with `replay_annotations` from the returned ids.
A request a sampler ended (its forced EOS) comes back with finish reason "sampler", as from the embedded
engine: the project's server (`slime_ext.tools.serve`) adds `"sampler": true` to the stop finish_reason;
SGLang reports that EOS as a matched stop token, so the client recomputes it (`replay_with_finish`: would
the chain have finished at the last position?).

Every payload is validated against sglang's own definitions before it is sent when sglang is installed
(`slime_ext.engine.sglang_payload`); requests go over `slime_ext.engine.sglang_http`, retried by the
project's rule (`slime_ext.clients.retry`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from sglang_patches.request_sampler import FINISH_SAMPLER, replay_with_finish
from slime_ext.clients.retry import attempts, call_with_retries
from slime_ext.data.generation import (FINISH_FAILED, GenerateRequest, GenerateResult, check_unique_rids,
                                       decode_routed_experts_b64, versions_from_spans)
from slime_ext.engine.sglang_http import HTTPStatusError, is_retryable, is_timeout, request_json
# PayloadError and io_struct_fields are re-exported for tests/engine/test_sglang_client.py (unchanged by the
# split); new code imports them from slime_ext.engine.sglang_payload
from slime_ext.engine.sglang_payload import (PayloadError, io_struct_fields, validate_generate_payload,
                                             validate_payload)

logger = logging.getLogger(__name__)

_FINISH_TYPES = {"stop": "stop", "length": "length", "abort": "abort"}
BATCHING = ("request", "group", "call")


def batch_payload(payloads: list[dict[str, Any]], wire_rids: list[str]) -> dict[str, Any]:
    """One /generate body for several single-request payloads (GenerateReqInput's batch form: per-row lists;
    `return_routed_experts` is one flag per body, so the payloads must agree on it)."""
    body: dict[str, Any] = {
        "rid": list(wire_rids),
        "input_ids": [p["input_ids"] for p in payloads],
        "sampling_params": [p["sampling_params"] for p in payloads],
        "return_logprob": [p["return_logprob"] for p in payloads],
    }
    processors = [p.get("custom_logit_processor") for p in payloads]
    if any(processors):
        body["custom_logit_processor"] = processors
    routed = {bool(p.get("return_routed_experts")) for p in payloads}
    if len(routed) != 1:
        raise ValueError("a batch mixes requests with and without return_routed_experts")
    if routed.pop():
        body["return_routed_experts"] = True
    loras = [p.get("lora_path") for p in payloads]
    if any(loras):
        body["lora_path"] = loras
    return body


class SGLangEngineClient:
    """One SGLang server (or a router in front of several) as a RolloutEngine.

    `generate` never raises for a single request and never drops one: a request that still fails after
    `max_retries` retries (connection errors, timeouts, 5xx; 4xx is not retried) comes back with
    finish_reason "failed" and the error. Retries after a timeout first abort the old attempt and use a
    fresh wire rid (`<rid>#retry<k>`: SGLang rejects a duplicate live rid); samplers still see `rid`.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        *,
        eos_token_id: Optional[int] = None,
        tokenizer_path: Optional[str] = None,
        decode: Optional[Callable[[Sequence[int]], str]] = None,
        max_concurrency: int = 512,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        vocab_size: Optional[int] = None,
        tp_size: int = 1,
        partner_vocab: Optional[int] = None,
        validate: Optional[bool] = None,
        api_key: Optional[str] = None,
        native_partner: bool = False,
        routing_key: Optional[Callable[[GenerateRequest], Optional[str]]] = None,
        moe_top_k: Optional[int] = None,
        batching: str = "request",
        max_batch: int = 64,
    ):
        self.base_url = base_url.rstrip("/")
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
        # How requests share /generate calls (SGLang's batch form: a list of prompts, one rid each):
        # "request" one per call (slime's way), "group" the requests of one prompt group per call (they go
        # to one engine anyway, and the loop needs all of a group before its advantages), "call" every
        # request of a generate() call (per routing key behind a router) in calls of at most `max_batch`.
        self.batching = batching
        self.max_batch = int(max_batch)
        self.moe_top_k = moe_top_k  # experts per token: splits meta_info.routed_experts (the wire has no shape)
        self.api_key = api_key  # sent as `Authorization: Bearer`, for servers started with --api-key
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.eos_token_id = eos_token_id
        self.tokenizer_path = tokenizer_path
        self._decode = decode
        # Requests in flight per generate call. The server can batch only what it has: a step's rollouts
        # should all be in flight at once (slime's --sglang-server-concurrency defaults to 512 per server;
        # the cap of 64 this had made the stand-in server decode a 512-rollout step in 64-request batches).
        self.max_concurrency = int(max_concurrency)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.vocab_size = vocab_size
        self.tp_size = int(tp_size)
        # The server is the two-model tandem engine (sglang_patches.tandem_model) with this vocabulary:
        # every request then carries the processor, so solo requests sample the senior's half only.
        self.partner_vocab = partner_vocab
        # The server hosts the partner model itself (the project's server started with --partner): partner
        # samplers travel as plain sampler specs, no two-model vocabulary.
        self.native_partner = bool(native_partner)
        # sglang-router's manual policy keeps requests with one `X-SMG-Routing-Key` on one worker: the
        # engine pool keys a prompt's group by its prompt, so the group shares that worker's prefix cache.
        self.routing_key = routing_key
        # None: validate payloads against sglang's definitions when sglang is installed here
        self.validate = importlib.util.find_spec("sglang") is not None if validate is None else bool(validate)
        self._lock = threading.Lock()
        self._aborted: set[str] = set()
        self._wire_rids: dict[str, str] = {}
        self._in_weight_session = False
        self.stats: dict[str, float] = {
            "requests": 0, "failed": 0, "aborted": 0, "retries": 0, "prompt_tokens": 0, "cached_tokens": 0,
            "generated_tokens": 0, "generate_seconds": 0.0,
        }

    # -- plumbing ----------------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _request(self, method: str, path: str, payload: Any = None, timeout: Optional[float] = None,
                 headers: Optional[dict[str, str]] = None) -> Any:
        return request_json(method, self._url(path), payload, timeout=timeout or self.timeout_s, headers=headers,
                            api_key=self.api_key)

    def _post_with_retries(self, path: str, payload: Any = None, method: str = "POST") -> Any:
        return call_with_retries(lambda: self._request(method, path, payload), self.max_retries, self.backoff_s,
                                 self.backoff_max_s, is_retryable, on_retry=lambda: self._count("retries"))

    def _count(self, key: str, value: float = 1) -> None:
        with self._lock:
            self.stats[key] += value

    # -- generation --------------------------------------------------------------------------------
    def build_payload(self, request: GenerateRequest, wire_rid: Optional[str] = None) -> dict[str, Any]:
        sampling = request.sampling.to_sglang()
        sampling["sampling_seed"] = int(request.seed)
        payload: dict[str, Any] = {
            "rid": wire_rid or request.rid,
            "input_ids": [int(t) for t in request.input_ids],
            "sampling_params": sampling,
            "return_logprob": bool(request.return_logprob),
        }
        if request.return_routed_experts:  # needs a server started with --enable-return-routed-experts
            payload["return_routed_experts"] = True
        if request.lora_name is not None:  # a LoRA adapter the server loaded (/load_lora_adapter_from_tensors)
            payload["lora_path"] = request.lora_name
        if request.sampler_specs or self.partner_vocab is not None:
            from sglang_patches.sglang_adapter import SamplerLogitProcessor, build_custom_params, check_hostable

            if not request.sampler_specs:  # solo request on a tandem server
                sampling["custom_params"] = {"partner_vocab": int(self.partner_vocab)}
                payload["custom_logit_processor"] = SamplerLogitProcessor.to_str()
                return payload
            if self.eos_token_id is None:
                raise ValueError(f"request {request.rid!r} has samplers but the client has no eos_token_id")
            chain = check_hostable(request.sampler_specs, request.seed,
                                   partner=self.partner_vocab is not None or self.native_partner)
            if chain.needs_decode and not self.tokenizer_path:
                raise ValueError(f"request {request.rid!r}: its samplers decode text; give the client a tokenizer_path")
            sampling["custom_params"] = build_custom_params(
                request.sampler_specs, request.seed, self.eos_token_id, request.rid,
                self.tokenizer_path if chain.needs_decode else None, partner_vocab=self.partner_vocab)
            # a sampler's finish forces eos_token_id: make sure SGLang stops on it
            stop_ids = list(sampling.get("stop_token_ids") or [])
            if int(self.eos_token_id) not in stop_ids:
                sampling["stop_token_ids"] = stop_ids + [int(self.eos_token_id)]
            payload["custom_logit_processor"] = SamplerLogitProcessor.to_str()
        return payload

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        check_unique_rids(requests)
        rids = [r.rid for r in requests]
        calls = self._calls(requests)
        workers = max(1, min(self.max_concurrency, len(calls)))
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sglang-client") as pool:
            answered = {res.rid: res for part in pool.map(self._generate_call, calls) for res in part}
        self._count("generate_seconds", time.perf_counter() - start)
        with self._lock:
            self._aborted.difference_update(rids)
        return [answered[rid] for rid in rids]

    def _calls(self, requests: list[GenerateRequest]) -> list[list[GenerateRequest]]:
        """The requests of each /generate call, by `batching`: a call never mixes routing keys (a router
        sends a whole body to one worker) nor requests with and without routed experts (one flag per body)."""
        if self.batching == "request":
            return [[r] for r in requests]
        keyed: dict[Any, list[GenerateRequest]] = {}
        for r in requests:
            route = self.routing_key(r) if self.routing_key is not None else None
            # a group: one prompt's samples, or one prompt's episodes on a later turn (their affinity key)
            group = None if self.batching != "group" else r.affinity if r.affinity is not None else tuple(r.input_ids)
            keyed.setdefault((route, group, r.return_routed_experts), []).append(r)
        return [members[i:i + self.max_batch] for members in keyed.values()
                for i in range(0, len(members), self.max_batch)]

    def _generate_call(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if len(requests) == 1:
            return [self._generate_one(requests[0])]
        return self._generate_batch(requests)

    def _failed(self, request: GenerateRequest, error: str) -> GenerateResult:
        logger.warning("sglang request %s failed: %s", request.rid, error)
        self._count("failed")
        return GenerateResult(rid=request.rid, output_ids=[], logprobs=[] if request.return_logprob else None,
                              finish_reason=FINISH_FAILED, annotations=[], cached_tokens=0,
                              prompt_len=len(request.input_ids), error=error)

    def _checked_payload(self, request: GenerateRequest) -> dict[str, Any]:
        """The request's /generate payload, validated against sglang's definitions when they are here."""
        payload = self.build_payload(request)
        if self.validate:
            validate_generate_payload(payload, self.vocab_size)
        return payload

    def _route_headers(self, request: GenerateRequest) -> Optional[dict[str, str]]:
        key = self.routing_key(request) if self.routing_key is not None else None
        return {"X-SMG-Routing-Key": key} if key else None

    def _generate_one(self, request: GenerateRequest, counted: bool = False) -> GenerateResult:
        if not counted:
            self._count("requests")
        try:
            payload = self._checked_payload(request)
        except Exception as exc:  # noqa: BLE001 - one bad request must not sink the batch
            return self._failed(request, f"invalid request: {exc}")
        last_error = "not sent"
        headers = self._route_headers(request)
        for attempt in attempts(self.max_retries, self.backoff_s, self.backoff_max_s,
                                on_retry=lambda: self._count("retries")):
            with self._lock:
                aborted = request.rid in self._aborted
                wire_rid = request.rid if attempt == 0 else f"{request.rid}#retry{attempt}"
                self._wire_rids[request.rid] = wire_rid
            if aborted:  # aborted before it was sent, or between attempts
                with self._lock:
                    self._wire_rids.pop(request.rid, None)
                return self._aborted_result(request)
            payload["rid"] = wire_rid
            try:
                body = self._request("POST", "/generate", payload, headers=headers)
            except Exception as exc:  # noqa: BLE001
                last_error = f"{type(exc).__name__}: {exc}"
                if is_timeout(exc):
                    last_error = f"timed out after {self.timeout_s}s ({exc})"
                    self._abort_wire(wire_rid)
                if not is_retryable(exc):
                    break
                continue
            try:
                return self._parse(request, body)
            except Exception as exc:  # noqa: BLE001
                last_error = f"unexpected /generate response: {exc}"
                break
            finally:
                with self._lock:
                    self._wire_rids.pop(request.rid, None)
        with self._lock:
            self._wire_rids.pop(request.rid, None)
        return self._failed(request, last_error)

    def _batch_refused(self, exc: HTTPStatusError, size: int) -> None:
        """A 422 means the server cannot read SGLang's batch form at all (sglang-router: "rid: invalid type:
        sequence"): stop batching for good. Other refusals concern this batch's contents."""
        if exc.status == 422 and self.batching != "request":
            logger.warning("%s does not take batched /generate bodies (%s): sending one request per call from "
                           "now on", self.base_url, str(exc)[:200])
            self.batching = "request"
        else:
            logger.info("a batch of %d requests was refused (%s): sending them one by one", size, str(exc)[:200])

    def _resend_one(self, request: GenerateRequest) -> GenerateResult:
        return self._generate_one(request, counted=True)

    def _aborted_result(self, request: GenerateRequest) -> GenerateResult:
        self._count("aborted")
        return GenerateResult(rid=request.rid, output_ids=[], logprobs=[] if request.return_logprob else None,
                              finish_reason="abort", annotations=[], cached_tokens=0, prompt_len=len(request.input_ids))

    def _generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Several requests in one /generate call (SGLang's batch form), with the single path's guarantees:
        an invalid request fails alone; retries (fresh wire rids) and aborts work per request; a batch the
        server refuses as a whole (4xx: a row it rejects, a body over its size cap) is sent again one
        request per call, so each request gets its own verdict."""
        out: dict[str, GenerateResult] = {}
        payloads: dict[str, dict[str, Any]] = {}
        for request in requests:
            self._count("requests")
            try:
                payloads[request.rid] = self._checked_payload(request)
            except Exception as exc:  # noqa: BLE001 - one bad request must not sink the batch
                out[request.rid] = self._failed(request, f"invalid request: {exc}")
        headers = self._route_headers(requests[0])  # a call never mixes routing keys (`_calls`)
        last_error = "not sent"
        live: list[GenerateRequest] = []
        try:
            for attempt in attempts(self.max_retries, self.backoff_s, self.backoff_max_s,
                                    on_retry=lambda: self._count("retries")):
                with self._lock:
                    live = [r for r in requests if r.rid in payloads and r.rid not in out]
                    gone = [r for r in live if r.rid in self._aborted]
                    live = [r for r in live if r.rid not in self._aborted]
                    wire = {r.rid: r.rid if attempt == 0 else f"{r.rid}#retry{attempt}" for r in live}
                    self._wire_rids.update(wire)
                for r in gone:  # aborted before it was sent, or between attempts
                    out[r.rid] = self._aborted_result(r)
                if not live:
                    break
                body = batch_payload([payloads[r.rid] for r in live], [wire[r.rid] for r in live])
                try:
                    answer = self._request("POST", "/generate", body, headers=headers)
                except Exception as exc:  # noqa: BLE001
                    last_error = f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, HTTPStatusError) and not is_retryable(exc):
                        self._batch_refused(exc, len(live))
                        with ThreadPoolExecutor(max_workers=min(len(live), self.max_concurrency)) as pool:
                            out.update((res.rid, res) for res in pool.map(self._resend_one, live))
                        break
                    if is_timeout(exc):
                        last_error = f"timed out after {self.timeout_s}s ({exc})"
                        for r in live:
                            self._abort_wire(wire[r.rid])
                    if not is_retryable(exc):
                        break
                    continue
                if not isinstance(answer, list) or len(answer) != len(live):
                    last_error = f"unexpected /generate response to a batch of {len(live)}: {str(answer)[:300]}"
                    break
                for r, item in zip(live, answer):
                    try:
                        out[r.rid] = self._parse(r, item)
                    except Exception as exc:  # noqa: BLE001
                        out[r.rid] = self._failed(r, f"unexpected /generate response: {exc}")
                break
        finally:
            with self._lock:
                for r in requests:
                    self._wire_rids.pop(r.rid, None)
        for r in requests:
            if r.rid not in out:
                out[r.rid] = self._failed(r, last_error)
        return [out[r.rid] for r in requests]

    def _parse(self, request: GenerateRequest, body: Any) -> GenerateResult:
        if not isinstance(body, dict) or "meta_info" not in body or "output_ids" not in body:
            raise ValueError(f"missing output_ids/meta_info in {str(body)[:300]}")
        meta = body["meta_info"]
        output_ids = [int(t) for t in body["output_ids"]]
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind not in _FINISH_TYPES:
            raise ValueError(f"unknown finish_reason {reason!r}")
        finish = _FINISH_TYPES[kind]
        if kind == "stop" and isinstance(reason, dict) and reason.get("sampler") is True:
            finish = FINISH_SAMPLER  # the project's server marks a sampler's forced EOS (SGLang cannot)
        logprobs = None
        if request.return_logprob:
            triples = meta.get("output_token_logprobs")
            if triples is None or len(triples) != len(output_ids):
                raise ValueError(f"{0 if triples is None else len(triples)} output logprobs for {len(output_ids)} tokens")
            if [int(t[1]) for t in triples] != output_ids:
                raise ValueError("output_token_logprobs token ids differ from output_ids")
            logprobs = [float(t[0]) for t in triples]
        decode = self._decoder() if request.sampler_specs else None
        annotations, sampler_finish = replay_with_finish(
            request.sampler_specs, request.seed, request.input_ids, output_ids,
            -1 if self.eos_token_id is None else int(self.eos_token_id), decode, rid=request.rid,
            vocab_size=self.vocab_size)
        if finish == "stop" and sampler_finish:
            finish = FINISH_SAMPLER  # SGLang reports a sampler's forced EOS as a matched stop: recomputed here
        prompt_len = int(meta.get("prompt_tokens", len(request.input_ids)))
        cached = int(meta.get("cached_tokens", 0))
        with self._lock:
            self.stats["prompt_tokens"] += prompt_len
            self.stats["cached_tokens"] += cached
            self.stats["generated_tokens"] += len(output_ids)
            if kind == "abort":
                self.stats["aborted"] += 1
        version = meta.get("weight_version")
        spans = meta.get("weight_versions")
        per_token = versions_from_spans(spans, len(output_ids), request.rid) if spans else None
        routed = None
        if request.return_routed_experts:
            routed = decode_routed_experts_b64(meta.get("routed_experts"), len(request.input_ids) + len(output_ids) - 1,
                                           self.moe_top_k, request.rid)
        return GenerateResult(rid=request.rid, output_ids=output_ids, logprobs=logprobs,
                              finish_reason=finish, annotations=annotations, cached_tokens=cached,
                              prompt_len=prompt_len, weight_version=None if version is None else str(version),
                              routed_experts=routed, token_versions=per_token)

    def _decoder(self) -> Optional[Callable[[Sequence[int]], str]]:
        if self._decode is None and self.tokenizer_path:
            from sglang_patches.sglang_adapter import decoder_for

            self._decode = decoder_for(self.tokenizer_path)
        return self._decode

    # -- control -------------------------------------------------------------------------------------
    def _abort_wire(self, wire_rid: str) -> None:
        # a control call: bounded, but not by a generation timeout tuned short (an abort lost to a busy host leaves
        # the request decoding on the server)
        try:
            self._request("POST", "/abort_request", {"rid": wire_rid}, timeout=min(max(self.timeout_s, 2.0), 10.0))
        except Exception as exc:  # noqa: BLE001 - best effort
            logger.debug("abort of %s failed: %s", wire_rid, exc)

    def abort(self, rid: str) -> None:
        """Abort request `rid` (its partial output comes back with finish_reason "abort")."""
        with self._lock:
            self._aborted.add(rid)
            wire = self._wire_rids.get(rid, rid)
        payload = {"rid": wire}
        if self.validate:
            validate_payload(payload, "AbortReq")
        self._post_with_retries("/abort_request", payload)

    def abort_all(self) -> None:
        self._post_with_retries("/abort_request", {"abort_all": True})

    def flush_cache(self) -> None:
        """Flush the radix cache (SGLang refuses with 400 while requests are running: raised here)."""
        self._post_with_retries("/flush_cache")

    def health(self, timeout_s: float = 5.0) -> bool:
        try:
            self._request("GET", "/health", timeout=timeout_s)
            return True
        except Exception:  # noqa: BLE001
            return False

    def _control(self, path: str, payload: dict[str, Any], class_name: str) -> Any:
        """One POST, not retried: weight transfers and group setup are collective with the trainer (a
        repeat would hang or apply twice) and the memory and session calls are not idempotent."""
        if self.validate:
            validate_payload(payload, class_name)
        out = self._request("POST", path, payload)
        if isinstance(out, dict) and out.get("success") is False:
            raise RuntimeError(f"{path} failed: {out.get('message')}")
        return out

    def model_info(self) -> dict[str, Any]:
        """GET /model_info (model_path, weight_version, ...); /get_model_info on servers without it."""
        try:
            return self._request("GET", "/model_info", timeout=min(self.timeout_s, 30.0))
        except HTTPStatusError as exc:
            if exc.status != 404:
                raise
            return self._request("GET", "/get_model_info", timeout=min(self.timeout_s, 30.0))

    def weight_version(self) -> Optional[str]:
        version = self.model_info().get("weight_version")
        return None if version is None else str(version)

    def update_weights_from_disk(self, model_path: str, *, weight_version: Optional[str] = None,
                                 flush_cache: bool = True, load_format: Optional[str] = None) -> None:
        """Load HF safetensors from `model_path` (a directory the server can read) into the running model."""
        payload: dict[str, Any] = {"model_path": str(model_path), "weight_version": weight_version,
                                   "flush_cache": flush_cache, "load_format": load_format}
        self._control("/update_weights_from_disk", payload, "UpdateWeightFromDiskReqInput")

    def begin_weight_update(self) -> None:
        self._control("/begin_weight_update", {}, "BeginWeightUpdateReqInput")
        self._in_weight_session = True

    def end_weight_update(self) -> None:
        try:
            self._control("/end_weight_update", {}, "EndWeightUpdateReqInput")
        finally:
            self._in_weight_session = False

    @contextlib.contextmanager
    def weight_update_session(self) -> Iterator[None]:
        """begin/end_weight_update around the body (nested use joins the open session)."""
        if self._in_weight_session:
            yield
            return
        self.begin_weight_update()
        try:
            yield
        finally:
            self.end_weight_update()

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                                   load_format: Optional[str] = None, flush_cache: bool = True,
                                   weight_version: Optional[str] = None) -> None:
        """Send tensors (CUDA tensors on the server's node: they travel as CUDA IPC handles) to every TP
        rank (`_per_rank_copies`)."""
        payload: dict[str, Any] = {
            "serialized_named_tensors": self._per_rank_copies(named_tensors),
            "load_format": load_format, "flush_cache": flush_cache, "weight_version": weight_version,
        }
        with self.weight_update_session():
            self._control("/update_weights_from_tensor", payload, "UpdateWeightsFromTensorReqInput")

    def _per_rank_copies(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """One serialized copy of `named_tensors` per TP rank: each rank needs its own (sglang's
        tp_worker.deserialize_own_rank)."""
        from sglang.srt.utils.common import MultiprocessingSerializer

        named = [(str(n), t) for n, t in named_tensors]
        return [MultiprocessingSerializer.serialize(named, output_str=True) for _ in range(self.tp_size)]

    def load_lora_adapter_from_tensors(self, name: str, config_dict: dict[str, Any],
                                       named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """SGLang's /load_lora_adapter_from_tensors: a PEFT adapter (names as in adapter_model.safetensors,
        `config_dict` its adapter_config.json), one serialized copy per TP rank; requests then name it
        (`GenerateRequest.lora_name` -> lora_path)."""
        payload = {"lora_name": name, "config_dict": dict(config_dict),
                   "serialized_named_tensors": self._per_rank_copies(named_tensors)}
        self._control("/load_lora_adapter_from_tensors", payload, "LoadLoRAAdapterFromTensorsReqInput")

    def unload_lora_adapter(self, name: str) -> None:
        self._control("/unload_lora_adapter", {"lora_name": name}, "UnloadLoRAAdapterReqInput")

    def update_weights_from_flattened_bucket(self, bucket: dict[str, Any], *, flush_cache: bool = True,
                                             weight_version: Optional[str] = None) -> None:
        """One SGLang `FlattenedTensorBucket` ({"flattened_tensor", "metadata"}, `weight_sync.sglang_flattened_bucket`)
        to every TP rank with `load_format="flattened_bucket"`: the engine rebuilds the HF-named tensors and
        loads them with its own model's `load_weights` (no custom loader)."""
        from sglang.srt.utils.common import MultiprocessingSerializer

        serialized = MultiprocessingSerializer.serialize(bucket, output_str=True)
        self.update_weights_from_serialized([serialized] * self.tp_size, flush_cache=flush_cache,
                                            weight_version=weight_version)

    def update_weights_from_serialized(self, per_rank: list[str], *, load_format: str = "flattened_bucket",
                                       flush_cache: bool = True, weight_version: Optional[str] = None) -> None:
        """`/update_weights_from_tensor` with one already serialized entry per engine TP rank (entry i is read by
        TP rank i: with colocated engines, handles to the trainer rank on that rank's own device)."""
        if len(per_rank) != self.tp_size:
            raise ValueError(f"{len(per_rank)} serialized entries for an engine of TP {self.tp_size}: one per TP rank")
        payload: dict[str, Any] = {"serialized_named_tensors": list(per_rank), "load_format": load_format,
                                   "flush_cache": flush_cache, "weight_version": weight_version}
        with self.weight_update_session():
            self._control("/update_weights_from_tensor", payload, "UpdateWeightsFromTensorReqInput")

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "nccl") -> None:
        self._control("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend,
        }, "InitWeightsUpdateGroupReqInput")

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[Any], shapes: Sequence[Sequence[int]],
                                        group_name: str = "weight_update_group", *, flush_cache: bool = True,
                                        weight_version: Optional[str] = None,
                                        load_format: Optional[str] = None) -> None:
        """Announce a broadcast of `names` over the update group (the trainer broadcasts the tensors on
        the group while this request is in flight). dtypes may be torch dtypes or names ("bfloat16")."""
        dtype_names = [str(d).removeprefix("torch.") for d in dtypes]
        with self.weight_update_session():
            self._control("/update_weights_from_distributed", {
                "names": list(names), "dtypes": dtype_names, "shapes": [list(map(int, s)) for s in shapes],
                "group_name": group_name, "flush_cache": flush_cache, "weight_version": weight_version,
                "load_format": load_format,
            }, "UpdateWeightsFromDistributedReqInput")

    def update_weight_version(self, version: str, abort_all_requests: bool = False) -> None:
        """Set the served weights' version (after a sync whose buckets carried none)."""
        self._control("/update_weight_version", {"new_version": str(version), "abort_all_requests": abort_all_requests},
                      "UpdateWeightVersionReqInput")

    def check_weights(self, action: str = "checksum", skip_tensor_list: Optional[list[str]] = None) -> dict[str, Any]:
        """SGLang's `/weights_checker`: snapshot, reset_tensors, compare (raises naming the tensors that differ)
        or checksum (`{"ranks": [ChecksumInfo per TP rank], "per_engine_checksum": ...}`)."""
        out = self._control("/weights_checker", {"action": action, "skip_tensor_list": skip_tensor_list},
                            "CheckWeightsReqInput")
        return out if isinstance(out, dict) else {}

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """Prefill-only scoring by the served model (on-policy distillation's teacher): one SGLang batch
        `/generate` with max_new_tokens 0, return_logprob and logprob_start_len = start - 1, whose
        meta_info.input_token_logprobs (first entry None) give the logprob of every token from `start` on."""
        if not sequences:
            return []
        payload = {"input_ids": [list(s) for s in sequences], "sampling_params": {"max_new_tokens": 0},
                   "return_logprob": True, "logprob_start_len": [int(s) - 1 for s in starts]}
        if self.validate:
            validate_payload(payload, "GenerateReqInput")
        answers = self._request("POST", "/generate", payload)
        out = []
        for seq, start, answer in zip(sequences, starts, answers):
            triples = answer["meta_info"].get("input_token_logprobs") or []
            if len(triples) != len(seq) - start + 1 or [int(t[1]) for t in triples] != list(seq[start - 1:]):
                raise ValueError(f"scoring: {len(triples)} input logprobs for the {len(seq) - start + 1} tokens from "
                                 f"position {start - 1}, or their token ids differ from the sequence's")
            out.append([float(t[0]) for t in triples[1:]])
        return out

    def pause_generation(self, mode: str = "abort") -> int:
        """SGLang's /pause_generation (abort, retract or in_place); returns the requests it touched where the
        server says (the project's server does)."""
        out = self._control("/pause_generation", {"mode": mode}, "PauseGenerationReqInput")
        return int(out.get("requests", 0)) if isinstance(out, dict) else 0

    def continue_generation(self) -> None:
        self._control("/continue_generation", {}, "ContinueGenerationReqInput")

    def release_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        """Free GPU memory (weights / kv_cache); needs the server flag --enable-memory-saver."""
        self._control("/release_memory_occupation", {"tags": tags}, "ReleaseMemoryOccupationReqInput")

    def resume_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        self._control("/resume_memory_occupation", {"tags": tags}, "ResumeMemoryOccupationReqInput")

    def metrics(self) -> dict[str, float]:
        with self._lock:
            out = dict(self.stats)
        out["prefix_cache_hit_rate"] = out["cached_tokens"] / max(out["prompt_tokens"], 1)
        out["failure_rate"] = out["failed"] / max(out["requests"], 1)
        out["decode_tokens_per_s"] = out["generated_tokens"] / max(out["generate_seconds"], 1e-9)
        return out


__all__ = ["SGLangEngineClient", "PayloadError", "io_struct_fields", "validate_payload", "validate_generate_payload"]
