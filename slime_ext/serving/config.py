"""Limits and knobs of the server, one place for the CLI, tests and in-process users."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ServeConfig:
    """Everything that bounds what one request or many requests can cost the server.

    `context_length` None means: take it from the engine (`max_position_embeddings` of the model's HF
    config); an engine without one (the exact solver) has no token limit beyond `max_prompt_tokens`.
    """

    # request bodies larger than this are refused before being read; None: on the prompt routes, enough for
    # a maximal prompt (context x max characters per token as JSON, see serving/token_bound.py), 4 MiB on
    # the others and where no token bound is known
    max_request_bytes: Optional[int] = None
    max_prompt_tokens: Optional[int] = None  # None: the context length
    context_length: Optional[int] = None  # prompt + max tokens must fit; None: from the engine
    max_concurrency: int = 128  # requests admitted to tokenisation + generation at once
    max_queue: int = 256  # requests waiting for a slot; beyond it: 429
    queue_timeout_s: float = 60.0  # a queued request waiting longer gets 429
    body_timeout_s: float = 30.0  # time to receive a request body once its headers arrived
    header_timeout_s: float = 15.0  # a connection that sends no complete request within this is closed
    keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this
    max_connections: int = 4096  # uvicorn's limit_concurrency: new requests beyond it get 503
    backlog: int = 2048  # listen backlog (the kernel caps it at net.core.somaxconn)
    max_n: int = 16  # choices per OpenAI request
    api_key: Optional[str] = None  # if set, every route but /health needs `Authorization: Bearer KEY`
    model_aliases: tuple[str, ...] = ("default",)  # model names accepted besides the served one
    # Batching of concurrent requests into one engine.generate call: the first request waits
    # `batch_window_s` for others; with `batch_settle_s` set, the window restarts with every arrival (up
    # to `batch_settle_s` after the first), so a burst (an RL step's requests) is taken whole instead of
    # its first few starting alone while the rest wait a whole call (engine servers use 20 ms / 2 s).
    batch_window_s: float = 0.005
    batch_settle_s: Optional[float] = None
    # requests arriving during a generate call join it between decode steps (engines that support it), and
    # each answer leaves as soon as its request finishes; off: a call runs its batch to the end
    continuous_batching: bool = True
    # waiting requests join a running call once they are this share of its running requests, or once the
    # oldest has waited admit_max_wait_s (each admission costs a prefill forward besides the decode step)
    admit_min_share: float = 0.125
    admit_max_wait_s: float = 0.25

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_concurrency", "max_queue", "max_connections", "backlog", "max_n"):
            if name == "max_request_bytes" and self.max_request_bytes is None:
                continue
            if int(getattr(self, name)) < (0 if name == "max_queue" else 1):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("admit_min_share", "admit_max_wait_s"):
            if not float(getattr(self, name)) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
