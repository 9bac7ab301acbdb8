"""A fast engine with the embedded engine's interface, for server tests that need many requests or
slow, abortable ones without a model."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Optional

from slime_ext.data.generation import GenerateRequest, GenerateResult, check_unique_rids
from slime_ext.engine.solver import CharTokenizer


class StubEngine:
    """Emits `a`, `b`, ... (code points) for `max_new_tokens` steps, `delay_s` per step; honours abort."""

    max_context_length = 64

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.tokenizer = CharTokenizer()
        self.calls = 0
        self.aborts: list[str] = []
        self.started: list[str] = []
        self._aborted: set[str] = set()
        self._lock = threading.Lock()

    def abort(self, rid: str) -> None:
        with self._lock:
            self.aborts.append(rid)
            self._aborted.add(rid)

    def flush_cache(self) -> None:
        pass

    def generate(self, requests: list[GenerateRequest],
                 on_token: Optional[Callable[[str, int], None]] = None) -> list[GenerateResult]:
        check_unique_rids(requests)
        self.calls += 1
        self.started.extend(r.rid for r in requests)
        outs: dict[str, list[int]] = {r.rid: [] for r in requests}
        finish = {r.rid: "length" for r in requests}
        for step in range(max(r.sampling.max_new_tokens for r in requests)):
            for r in requests:
                with self._lock:
                    if r.rid in self._aborted:
                        finish[r.rid] = "abort"
                if finish[r.rid] == "abort" or step >= r.sampling.max_new_tokens:
                    continue
                tok = 97 + (r.seed + step) % 26
                outs[r.rid].append(tok)
                if on_token is not None:
                    on_token(r.rid, tok)
            if self.delay_s:
                time.sleep(self.delay_s)
        with self._lock:
            self._aborted.difference_update(outs)
        return [GenerateResult(r.rid, outs[r.rid], [-1.0] * len(outs[r.rid]), finish[r.rid], [{} for _ in outs[r.rid]],
                               0, len(r.input_ids)) for r in requests]


@contextlib.contextmanager
def running(engine: Any = None, tokenizer: Any = None, max_tokens: int = 8, **cfg: Any) -> Iterator[tuple]:
    """An in-process server over `engine` (a stub by default; its tokenizer unless `tokenizer`) with
    ServeConfig(**cfg); yields (server, state, engine) and shuts both down on exit."""
    from slime_ext.serving import ServeConfig, ServerState, serve

    engine = engine or StubEngine()
    state = ServerState(engine, tokenizer or engine.tokenizer, "stub", max_tokens=max_tokens, config=ServeConfig(**cfg))
    srv = serve(state)
    try:
        yield srv, state, engine
    finally:
        srv.shutdown()
        state.batcher.close()
