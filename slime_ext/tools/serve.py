"""An OpenAI-compatible HTTP server over the embedded engine: `python -m slime_ext.tools.serve --model HF_DIR`.

Routes (the subset of OpenAI's and SGLang's APIs this project's clients use, same schemas):
- `POST /v1/chat/completions`, `POST /v1/completions` (`stream: true` gives server-sent events ending in
  `data: [DONE]`; the extension `speak_only: true` runs SxS's channel sampler and returns / streams only
  the speak channel, as a user of an interleaved-reasoning model sees it), `GET /v1/models`;
- `POST /generate`: SGLang's native token-id route (`input_ids`, `sampling_params` incl.
  `sampling_seed` and `custom_params`, `return_logprob`, `rid`), answered like SGLang
  (`output_ids`, `meta_info.finish_reason.type`, `output_token_logprobs` triples, `cached_tokens`), so
  `SGLangEngineClient` talks to this server and to a real SGLang server alike; per-request samplers
  travel in `custom_params.sampler_specs` as they do to SGLang and run natively here;
- `POST /abort_request`, `POST /flush_cache`, `GET /health`.

Local models play the judge (SxS data construction) and the cloud model (DA-GRPO) through it.
Concurrent requests are batched: a worker thread takes everything queued (up to `--max-batch`) into
one `generate` call, so N clients cost about one batched decode, not N sequential ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest, GenerateResult

log = logging.getLogger("slime_ext.tools.serve")
FINISH_OPENAI = {"stop": "stop", "sampler": "stop", "length": "length", "abort": "abort", "failed": "error"}


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400, OpenAI-style error body)."""


class Batcher:
    """Collects concurrent requests into batched `engine.generate` calls on one worker thread."""

    def __init__(self, engine: Any, max_batch: int = 64, window_s: float = 0.005):
        self.engine, self.max_batch, self.window_s = engine, int(max_batch), float(window_s)
        self.queue: "queue.Queue[tuple[GenerateRequest, Future, Optional[Callable[[int], None]]]]" = queue.Queue()
        self.calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: GenerateRequest, on_token: Optional[Callable[[int], None]] = None) -> Future:
        fut: Future = Future()
        self.queue.put((request, fut, on_token))
        return fut

    def close(self) -> None:
        self._stop.set()
        self.queue.put(None)  # type: ignore[arg-type]
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            first = self.queue.get()
            if first is None:
                return
            items = [first]
            deadline = time.monotonic() + self.window_s
            while len(items) < self.max_batch:
                try:
                    item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._stop.set()
                    break
                items.append(item)
            self._run(items)

    def _run(self, items: list) -> None:
        # rids must be unique within one generate call: suffix duplicates from different clients
        seen: dict[str, int] = {}
        requests, callbacks = [], {}
        for req, _, cb in items:
            n = seen.get(req.rid, 0)
            seen[req.rid] = n + 1
            if n:
                req = GenerateRequest(f"{req.rid}#{n}", req.input_ids, req.sampling, req.seed, req.sampler_specs,
                                      req.return_logprob)
            requests.append(req)
            if cb is not None:
                callbacks[req.rid] = cb
        self.calls += 1
        try:
            results = self.engine.generate(
                requests, on_token=(lambda rid, tok: callbacks[rid](tok) if rid in callbacks else None) if callbacks else None)
        except Exception as exc:  # noqa: BLE001 - every waiting client gets the error
            for _, fut, _ in items:
                fut.set_exception(exc)
            return
        for (_, fut, _), res in zip(items, results):
            fut.set_result(res)


def _sampling_from(body: dict, max_key: str, default_max: int) -> SamplingParams:
    try:
        stop = body.get("stop") or []
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k", -1)), max_new_tokens=int(body.get(max_key) or default_max),
            stop=[stop] if isinstance(stop, str) else list(stop), stop_token_ids=list(body.get("stop_token_ids") or []),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"sampling parameters: {exc}") from None


class ServerState:
    """The engine, tokenizer and template behind the handlers."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str, template: str = "plain",
                 max_tokens: int = 256, max_batch: int = 64):
        from slime_ext.tasks.templates import get_template

        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.template_name = template
        self.template = get_template(template)
        self.max_tokens = int(max_tokens)
        self.batcher = Batcher(engine, max_batch=max_batch)
        self._seeds = itertools.count(1)
        self.lock = threading.Lock()
        self.openai_requests = 0  # chat/completion requests served (tests count cloud calls with it)

    def render_chat(self, messages: Any) -> str:
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content}")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                    not isinstance(m.get("content"), str):
                raise BadRequest(f"messages[{i}] must be {{role: system|user|assistant, content: string}}")
        if self.template_name == "qwen_chat":
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return text + "<|im_start|>assistant\n"
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise BadRequest("messages need at least one user message")
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        return self.template.format((system + "\n" if system else "") + users[-1])

    def sxs_spec(self, enforce: bool = True) -> dict:
        from sglang_patches.sxs import tag_ids

        try:
            return {"kind": "sxs_channel", **tag_ids(self.tokenizer), "enforce": enforce}
        except ValueError as exc:
            raise BadRequest(f"speak_only: {exc}") from None

    def visible_text(self, res: GenerateResult) -> str:
        from sglang_patches.sxs import tag_ids, visible_token_ids

        channels = [int(a.get("channel", 0)) for a in res.annotations]
        return self.tokenizer.decode(visible_token_ids(res.output_ids, channels, tag_ids(self.tokenizer)),
                                     skip_special_tokens=True)

    def channel_tracker(self) -> Callable[[int], bool]:
        """A per-stream function: feed each emitted token, get whether the user may see it."""
        from sglang_patches.request_sampler import RequestView
        from sglang_patches.sxs import SPEAK, SxSChannelSampler, tag_ids

        tags = tag_ids(self.tokenizer)
        tracker = SxSChannelSampler(0, **tags, enforce=False)
        view = RequestView("stream", 0, [], [], self.tokenizer.eos_token_id)
        tag_set = set(tags.values())

        def visible(tok: int) -> bool:
            return tracker.on_token(tok, view)["channel"] == SPEAK and tok not in tag_set

        return visible

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text)["input_ids"]
        if not ids:
            raise BadRequest("the prompt is empty after tokenisation")
        return ids

    def request(self, ids: list[int], sampling: SamplingParams, body: dict, specs: Optional[list] = None,
                rid: Optional[str] = None) -> GenerateRequest:
        seed = body.get("seed", body.get("sampling_seed"))
        seed = int(seed) if seed is not None else next(self._seeds)
        return GenerateRequest(rid or f"req-{uuid.uuid4().hex[:12]}", ids, sampling, seed, specs or [],
                               return_logprob=True)


def _completion_text(state: ServerState, res: GenerateResult) -> str:
    ids = [t for t in res.output_ids if t != state.tokenizer.eos_token_id]
    return state.tokenizer.decode(ids, skip_special_tokens=True)


def make_handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # route access logs through logging
            log.debug("%s %s", self.address_string(), fmt % args)

        # -- plumbing ------------------------------------------------------------------------------
        def _json(self, code: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
            self._json(code, {"error": {"message": message, "type": kind, "code": code}})

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as exc:
                raise BadRequest(f"request body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "slime_ext"}]})
            else:
                self._error(404, f"no route GET {self.path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802
            routes = {"/v1/chat/completions": self._chat, "/v1/completions": self._completions,
                      "/generate": self._generate, "/abort_request": self._abort, "/flush_cache": self._flush}
            route = routes.get(self.path)
            if route is None:
                self._error(404, f"no route POST {self.path}", "not_found")
                return
            try:
                route(self._body())
            except BadRequest as exc:
                self._error(400, str(exc))
            except BrokenPipeError:
                pass
            except Exception as exc:  # noqa: BLE001 - the server keeps serving
                log.exception("request failed")
                self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

        # -- OpenAI routes -------------------------------------------------------------------------
        def _chat(self, body: dict) -> None:
            prompt = state.render_chat(body.get("messages"))
            self._openai(body, state.encode(prompt), chat=True)

        def _completions(self, body: dict) -> None:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = list(prompt)
            elif isinstance(prompt, str):
                ids = state.encode(prompt)
            else:
                raise BadRequest("'prompt' must be a string or a list of token ids")
            self._openai(body, ids, chat=False)

        def _openai(self, body: dict, ids: list[int], chat: bool) -> None:
            with state.lock:
                state.openai_requests += 1
            sampling = _sampling_from(body, "max_tokens", state.max_tokens)
            speak_only = bool(body.get("speak_only"))  # SxS: the user sees only the speak channel
            req = state.request(ids, sampling, body, [state.sxs_spec(bool(body.get("enforce_tags", True)))] if speak_only else None)
            created, rid = int(time.time()), f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
            kind = "chat.completion" if chat else "text_completion"
            if body.get("stream"):
                self._stream(req, rid, created, chat, speak_only)
                return
            res = state.batcher.submit(req).result()
            text = state.visible_text(res) if speak_only else _completion_text(state, res)
            choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH_OPENAI.get(res.finish_reason, "stop"), "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self._json(200, {"id": rid, "object": kind, "created": created, "model": state.model_name,
                             "choices": [choice],
                             "usage": {"prompt_tokens": len(ids), "completion_tokens": len(res.output_ids),
                                       "total_tokens": len(ids) + len(res.output_ids)}})

        def _stream(self, req: GenerateRequest, rid: str, created: int, chat: bool, speak_only: bool = False) -> None:
            tokens: "queue.Queue[Optional[int]]" = queue.Queue()
            fut = state.batcher.submit(req, on_token=tokens.put)
            fut.add_done_callback(lambda _: tokens.put(None))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"
            emitted, ids = "", []
            channel = state.channel_tracker() if speak_only else None

            def send(delta: str, finish: Optional[str]) -> None:
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
                if chat:
                    choice["delta"] = {"content": delta} if delta or finish is None else {}
                else:
                    choice["text"] = delta
                chunk = {"id": rid, "object": kind, "created": created, "model": state.model_name, "choices": [choice]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

            while (tok := tokens.get()) is not None:
                if tok == state.tokenizer.eos_token_id:
                    continue
                if channel is not None and not channel(tok):
                    continue  # private (think) token or a tag: not streamed
                ids.append(tok)
                text = state.tokenizer.decode(ids, skip_special_tokens=True)
                if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte
                    continue
                delta, emitted = text[len(emitted):], text
                if delta:
                    send(delta, None)
            res = fut.result()
            final = state.tokenizer.decode(ids, skip_special_tokens=True)
            if final.startswith(emitted) and len(final) > len(emitted):  # bytes held back at the end
                send(final[len(emitted):], None)
            send("", FINISH_OPENAI.get(res.finish_reason, "stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        # -- SGLang's native routes ----------------------------------------------------------------
        def _generate(self, body: dict) -> None:
            ids = body.get("input_ids")
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise BadRequest("/generate needs 'input_ids': a non-empty list of token ids")
            sp = body.get("sampling_params") or {}
            sampling = _sampling_from(sp, "max_new_tokens", state.max_tokens)
            specs = None
            custom = sp.get("custom_params") or {}
            if custom.get("sampler_specs"):
                from sglang_patches.sglang_adapter import decode_specs

                specs = decode_specs(custom["sampler_specs"])
            req = state.request(ids, sampling, sp, specs, rid=body.get("rid"))
            res = state.batcher.submit(req).result()
            meta: dict[str, Any] = {
                "id": req.rid, "finish_reason": {"type": res.finish_reason if res.finish_reason != "sampler" else "stop"},
                "prompt_tokens": len(ids), "completion_tokens": len(res.output_ids), "cached_tokens": res.cached_tokens,
            }
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(res.logprobs or [], res.output_ids)]
            self._json(200, {"text": _completion_text(state, res), "output_ids": res.output_ids, "meta_info": meta})

        def _abort(self, body: dict) -> None:
            if body.get("abort_all"):
                raise BadRequest("abort_all is not supported by the embedded server; abort by rid")
            if not body.get("rid"):
                raise BadRequest("/abort_request needs 'rid'")
            state.engine.abort(str(body["rid"]))
            self._json(200, {"success": True})

        def _flush(self, body: dict) -> None:
            state.engine.flush_cache()
            self._json(200, {"success": True})

    return Handler


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the server on a background thread; returns it (`server.server_address`, `server.shutdown()`)."""
    server = ThreadingHTTPServer((host, port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="serve-http", daemon=True).start()
    return server


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slime_ext.tools.serve", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF checkpoint directory (with its tokenizer)")
    src.add_argument("--solver", choices=["synthetic_math", "synthetic_math_answer"],
                     help="serve an exact solver instead of a model (DA-GRPO's embedded 'cloud')")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--template", default="plain", help="chat rendering: plain (Question/Answer) or qwen_chat")
    ap.add_argument("--max-tokens", type=int, default=256, help="default completion length")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default=None, help="model name reported by /v1/models (default: the path)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    import torch

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    if args.solver:
        from slime_ext.engine.solver import SolverEngine

        engine = SolverEngine(args.solver)
        tokenizer = engine.tokenizer
    else:
        try:
            tokenizer = load_tokenizer(args.model)
            engine = EmbeddedEngine.from_pretrained(args.model)
        except (OSError, ValueError) as exc:
            print(f"error: --model {args.model}: {exc}", file=sys.stderr)
            return 2
    source = args.model or f"solver:{args.solver}"
    state = ServerState(engine, tokenizer, args.name or source, args.template, args.max_tokens, args.max_batch)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    log.info("serving %s on http://%s:%d (OpenAI /v1/*, SGLang /generate)", source, args.host, server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        server.server_close()
        state.batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
