"""A small client for OpenAI-compatible endpoints (our `slime_ext.tools.serve`, SGLang's `/v1`, hosted APIs).

Chat completions with timeouts, retries with exponential backoff (`slime_ext.clients.retry`: connection
errors, timeouts, 429 and 5xx; a 4xx is final), a concurrency cap for batches, an optional circuit breaker,
and per-call accounting. A failed call raises `CallFailed` naming the endpoint and the last error; batch
helpers return the exception in its slot instead, so one failure never sinks a batch. The SxS judge and
DA-GRPO's cloud model use it.

Worst case of one call to a dead endpoint: (max_retries + 1) x timeout_s plus the backoff sleeps. With a
`CircuitBreaker` each attempt asks it first: once it is open, retries stop and new calls fail at once with
`CallSkipped` (no attempt made) until its cool-down ends. The breaker admits no more attempts at once than
can still fail before it opens, so with c calls in flight at most `failures` attempts are made, not
`failures + c - 1`; an attempt beyond that waits in `allow()` for one in flight to end.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

from slime_ext.clients.circuit_breaker import CircuitBreaker
from slime_ext.clients.retry import attempts, is_retryable


class CallFailed(RuntimeError):
    """An endpoint call that did not succeed after its retries."""


class CallSkipped(CallFailed):
    """A call not attempted at all: the circuit breaker was open (the endpoint failed repeatedly)."""


@dataclass
class ChatResult:
    text: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    seconds: float = 0.0


def _retryable(exc: BaseException) -> bool:
    return is_retryable(exc, exc.code if isinstance(exc, urllib.error.HTTPError) else None)


class OpenAIClient:
    def __init__(self, base_url: str, model: str = "default", api_key: Optional[str] = None, timeout_s: float = 60.0,
                 max_retries: int = 3, backoff_s: float = 0.5, backoff_max_s: float = 8.0, max_concurrency: int = 16,
                 breaker: Optional[CircuitBreaker] = None):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model, self.api_key = model, api_key
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.max_concurrency = int(max_concurrency)
        self.breaker = breaker
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "failed": 0, "skipped": 0, "retries": 0, "attempts": 0, "prompt_tokens": 0,
                      "completion_tokens": 0}

    def __getstate__(self) -> dict:
        """Picklable (a method holding a client is handed to the rollout manager actor): all but the lock."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _post(self, path: str, payload: dict, stream: bool = False) -> Any:
        req = urllib.request.Request(self.base_url + path, data=json.dumps(payload).encode(), method="POST",
                                     headers=self._headers())
        resp = urllib.request.urlopen(req, timeout=self.timeout_s)  # noqa: S310 - configured endpoint
        if stream:
            return resp
        with resp:
            return json.loads(resp.read().decode())

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.stats[k] += v

    def chat(self, messages: Sequence[dict], **params: Any) -> ChatResult:
        """One chat completion (`params`: temperature, max_tokens, stop, seed, top_p ...)."""
        payload = {"model": self.model, "messages": list(messages), **params}
        start, last, made = time.perf_counter(), "not sent", 0
        self._count(calls=1)
        # retries are counted below, once the breaker has let the attempt through
        for attempt in attempts(self.max_retries, self.backoff_s, self.backoff_max_s):
            if self.breaker is not None and not self.breaker.allow():
                if not made:
                    self._count(skipped=1)
                    raise CallSkipped(f"{self.base_url}/chat/completions not called: the circuit breaker is open "
                                      f"after {self.breaker.failures} failed attempts in a row")
                last += " (no more retries: the circuit breaker opened)"
                break
            if attempt:
                self._count(retries=1)
            made += 1
            self._count(attempts=1)
            try:
                body = self._post("/chat/completions", payload)
                choice = body["choices"][0]
                usage = body.get("usage") or {}
                self._count(prompt_tokens=int(usage.get("prompt_tokens", 0)),
                            completion_tokens=int(usage.get("completion_tokens", 0)))
                self._breaker_record(ok=True)
                return ChatResult(choice["message"]["content"] or "", choice.get("finish_reason") or "stop", usage,
                                  attempt + 1, time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001
                last = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, urllib.error.HTTPError):
                    last += f" ({exc.read().decode(errors='replace')[:300]})"
                # a final error (4xx, a malformed body) came back at once: not the stall the breaker guards against
                self._breaker_record(ok=not _retryable(exc))
                if not _retryable(exc):
                    break
            except BaseException:  # interrupted mid-attempt: free the breaker's slot for the other callers
                if self.breaker is not None:
                    self.breaker.release()
                raise
        self._count(failed=1)
        raise CallFailed(f"{self.base_url}/chat/completions failed after {made} attempt(s): {last}")

    def _breaker_record(self, ok: bool) -> None:
        if self.breaker is not None:
            (self.breaker.record_success if ok else self.breaker.record_failure)()

    def chat_many(self, conversations: Sequence[Sequence[dict]], **params: Any) -> list[ChatResult | CallFailed]:
        """Many chats with at most `max_concurrency` in flight; failures come back in their slots."""

        def one(msgs: Sequence[dict]) -> ChatResult | CallFailed:
            try:
                return self.chat(msgs, **params)
            except CallFailed as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(conversations)))) as pool:
            return list(pool.map(one, conversations))

    def stream_chat(self, messages: Sequence[dict], **params: Any) -> Iterator[str]:
        """Yield content deltas of a streamed chat completion as they arrive."""
        resp = self._post("/chat/completions", {"model": self.model, "messages": list(messages), "stream": True, **params},
                          stream=True)
        with resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                delta = json.loads(data)["choices"][0].get("delta", {}).get("content")
                if delta:
                    yield delta
