"""The cloud side of DA-GRPO: one call per prompt group that asked for help, shared by the group.

Any OpenAI-compatible endpoint (our `slime_ext.serve` locally, an SGLang server or a hosted API on a
cluster) through `OpenAIClient` (timeouts, retries with backoff, a concurrency cap). A call that still
fails is returned as None: the group's help-seeking responses count as unanswered requests (nothing is
spliced), and the failure is counted; the run never crashes on it and no sample is dropped.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from slime_ext.engine.openai_client import CallFailed

SOLVER_PREFIX = "solver:"
_solver_servers: dict[str, str] = {}  # solver name -> URL of this process's server
_solver_lock = threading.Lock()


def resolve_cloud_url(url: str) -> str:
    """`solver:NAME` starts (once per process) an in-process OpenAI-compatible server over an exact
    solver (`slime_ext.engine.solver`) and returns its URL, so the embedded default needs no second
    process; any other URL is returned as it is. Requests still go over HTTP either way."""
    if not url.startswith(SOLVER_PREFIX):
        return url
    name = url[len(SOLVER_PREFIX):]
    with _solver_lock:
        if name not in _solver_servers:
            from slime_ext.engine.solver import SolverEngine
            from slime_ext.serve import ServerState, serve

            engine = SolverEngine(name)
            server = serve(ServerState(engine, engine.tokenizer, url))
            _solver_servers[name] = f"http://127.0.0.1:{server.server_address[1]}"
        return _solver_servers[name]


class CloudHelper:
    def __init__(self, client: Any, max_tokens: int = 256, temperature: float = 0.0):
        self.client, self.max_tokens, self.temperature = client, int(max_tokens), float(temperature)
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def answer(self, questions: Sequence[Optional[str]]) -> list[Optional[str]]:
        """One completion per non-None question (groups that asked), None elsewhere or on failure."""
        wanted = [i for i, q in enumerate(questions) if q is not None]
        out: list[Optional[str]] = [None] * len(questions)
        if not wanted:
            return out
        convs = [[{"role": "user", "content": questions[i]}] for i in wanted]
        results = self.client.chat_many(convs, max_tokens=self.max_tokens, temperature=self.temperature, seed=0)
        with self._lock:
            self.calls += len(wanted)
            for i, res in zip(wanted, results):
                if isinstance(res, CallFailed) or isinstance(res, Exception):
                    self.failures += 1
                else:
                    out[i] = res.text
        return out
