"""Engine servers that only score: a fixed checkpoint (on-policy distillation's teacher) answering prefill-only
requests (SGLang's `/generate` with max_new_tokens 0, return_logprob, logprob_start_len), never synced.

Why a pool of its own: the rollout pool (`server_pool.ServerEnginePool`) carries weight versions, syncs, pauses
and restarts for a policy that changes every step; a teacher needs none of it, only its requests spread over its
servers and kept small (`SCORE_REQUEST_SEQUENCES` sequences per request, so no single request holds a whole
step's batch).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

from slime_ext.engine.sglang_client import SGLangEngineClient

SCORE_REQUEST_SEQUENCES = 64


class ScoringPool:
    def __init__(self, urls: Sequence[str], *, timeout_s: float = 600.0, validate: Optional[bool] = None,
                 client_kwargs: Optional[dict[str, Any]] = None):
        if not urls:
            raise ValueError("a scoring pool needs at least one server URL")
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.validate = validate
        self.client_kwargs = dict(client_kwargs or {})
        self._clients: Optional[list[SGLangEngineClient]] = None

    def __getstate__(self) -> dict[str, Any]:  # handed to the rollout manager's actor: clients are per process
        return {**self.__dict__, "_clients": None}

    @property
    def clients(self) -> list[SGLangEngineClient]:
        if self._clients is None:
            self._clients = [SGLangEngineClient(u, timeout_s=self.timeout_s, max_retries=2, backoff_s=0.2,
                                                validate=self.validate, **self.client_kwargs) for u in self.urls]
        return self._clients

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """The served model's logprob of every token of `sequences[i]` from position `starts[i]` on (temperature
        1, the ids as given), in order. Requests of `SCORE_REQUEST_SEQUENCES` go to the servers in turn, all in
        flight at once."""
        if len(sequences) != len(starts):
            raise ValueError(f"score: {len(sequences)} sequences but {len(starts)} starts")
        chunks = [(i, min(i + SCORE_REQUEST_SEQUENCES, len(sequences)))
                  for i in range(0, len(sequences), SCORE_REQUEST_SEQUENCES)]
        if not chunks:
            return []
        clients = self.clients
        with ThreadPoolExecutor(max_workers=min(len(chunks), 4 * len(clients))) as pool:
            parts = list(pool.map(lambda k: clients[k % len(clients)].score(sequences[chunks[k][0]:chunks[k][1]],
                                                                             starts[chunks[k][0]:chunks[k][1]]),
                                  range(len(chunks))))
        return [lp for part in parts for lp in part]


__all__ = ["ScoringPool", "SCORE_REQUEST_SEQUENCES"]
