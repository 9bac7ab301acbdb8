"""A circuit breaker for calls to a remote endpoint: stop calling a dead or stalled endpoint for a while.

Without it every call to a dead endpoint pays its full timeout on every retry: at DA-GRPO's defaults
(30 s timeout, 3 retries, 4 in flight) 8 failing calls took 248 s. After `failures` consecutive failed
attempts the breaker opens: attempts are refused at once for `cooldown_s`; then one probe attempt is let
through (half-open) and closes the breaker on success or reopens it on failure. Thread-safe; the clock
is injectable for tests. (pybreaker would do, but it is not a dependency and this is 60 lines.)
"""

from __future__ import annotations

import threading
import time
from typing import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(self, failures: int = 5, cooldown_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        if failures < 1:
            raise ValueError(f"circuit breaker: failures must be >= 1, got {failures}")
        if not cooldown_s > 0:
            raise ValueError(f"circuit breaker: cooldown_s must be > 0, got {cooldown_s}")
        self.failures, self.cooldown_s, self.clock = int(failures), float(cooldown_s), clock
        self._state, self._consecutive, self._opened_at = CLOSED, 0, 0.0
        self._probe_out = False
        self.opened = 0  # how many times it opened (for logs and tests)
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def allow(self) -> bool:
        """Whether an attempt may be made now (in half-open state: only the one probe)."""
        with self._lock:
            if self._state == OPEN and self.clock() - self._opened_at >= self.cooldown_s:
                self._state, self._probe_out = HALF_OPEN, False
            if self._state == CLOSED:
                return True
            if self._state == HALF_OPEN and not self._probe_out:
                self._probe_out = True
                return True
            return False

    def record_success(self) -> None:
        """The endpoint answered: close the breaker and forget earlier failures."""
        with self._lock:
            self._state, self._consecutive, self._probe_out = CLOSED, 0, False

    def record_failure(self) -> None:
        """A failed attempt (timeout, connection error, 429/5xx): open after `failures` in a row, or at
        once when the half-open probe fails."""
        with self._lock:
            self._consecutive += 1
            if self._state == HALF_OPEN or (self._state == CLOSED and self._consecutive >= self.failures):
                self._state, self._opened_at, self._probe_out = OPEN, self.clock(), False
                self.opened += 1
