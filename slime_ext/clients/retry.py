"""Retries of HTTP calls: which errors are worth another attempt, and the attempt schedule with its backoff.

One policy for every client of the project (`OpenAIClient`, `SGLangEngineClient`): at most
`max_retries` retries after the first attempt, retry k (k >= 1) waits `min(backoff_s * 2**(k-1),
backoff_max_s)` first; connection errors, timeouts (any `OSError`), 429 and 5xx are retried, any other
HTTP status is final. What a client does between attempts (abort a timed-out request, ask a circuit
breaker, count) stays in the client: `attempts` yields each attempt's number to the client's own loop;
`call_with_retries` is that loop for a plain call.
"""

from __future__ import annotations

import socket
import time
import urllib.error
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")

# errors of the transport (connection refused or reset, timeouts, DNS): worth another attempt
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (urllib.error.URLError, ConnectionError, TimeoutError,
                                                     socket.timeout, OSError)


def retryable_status(status: int) -> bool:
    """An HTTP status worth another attempt: 5xx, and 429 (the server's queue is full: back off and retry)."""
    return status >= 500 or status == 429


def is_retryable(exc: BaseException, status: Optional[int] = None) -> bool:
    """`status`: the HTTP status when `exc` is an error response (then only `retryable_status` is retried);
    None: `exc` is retried when it is a transport error."""
    if status is not None:
        return retryable_status(status)
    return isinstance(exc, TRANSIENT_ERRORS)


def backoff_delay(retry: int, backoff_s: float, backoff_max_s: float) -> float:
    """Seconds to wait before retry number `retry` (1 = the second attempt): exponential, capped."""
    return min(backoff_s * (2 ** (retry - 1)), backoff_max_s)


def attempts(max_retries: int, backoff_s: float, backoff_max_s: float,
             on_retry: Optional[Callable[[], None]] = None) -> Iterator[int]:
    """Attempt numbers 0 .. max_retries; before each retry `on_retry()` (if given) is called, then the
    backoff is slept. Break out of the loop on success or a final error."""
    for attempt in range(max_retries + 1):
        if attempt:
            if on_retry is not None:
                on_retry()
            time.sleep(backoff_delay(attempt, backoff_s, backoff_max_s))
        yield attempt


def call_with_retries(fn: Callable[[], T], max_retries: int, backoff_s: float, backoff_max_s: float,
                      retryable: Callable[[BaseException], bool],
                      on_retry: Optional[Callable[[], None]] = None) -> T:
    """`fn()`, retried on `Exception`s that `retryable` accepts; a final error, or the last one once the
    retries are spent, is raised as it came."""
    last: Optional[BaseException] = None
    for _ in attempts(max_retries, backoff_s, backoff_max_s, on_retry):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified by `retryable`
            last = exc
            if not retryable(exc):
                raise
    assert last is not None
    raise last
