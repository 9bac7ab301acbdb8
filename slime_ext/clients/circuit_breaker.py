"""A circuit breaker for calls to a remote endpoint: stop calling a dead or stalled endpoint for a while.

Without it every call to a dead endpoint pays its full timeout on every retry: at DA-GRPO's defaults
(30 s timeout, 3 retries, 4 in flight) 8 failing calls took 248 s. After `failures` consecutive failed
attempts the breaker opens: attempts are refused at once for `cooldown_s`; then one probe attempt is let
through (half-open) and closes the breaker on success or reopens it on failure. Thread-safe; the clock
is injectable for tests. (pybreaker would do, but it is not a dependency and this is small.)

Attempts in flight count against the threshold: while closed, at most `failures - consecutive failures`
attempts are admitted at once, so concurrent callers cannot push the failures past `failures` before the
breaker opens (before, 4 in flight opened it after 6-8 failed attempts). An attempt that would exceed that
waits in `allow()` until one in flight ends: it is admitted if that one succeeded, refused if the breaker
opened. Every admitted attempt must end with `record_success`, `record_failure` or `release`.
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
        self._in_flight = 0  # attempts admitted and not yet recorded
        self.opened = 0  # how many times it opened (for logs and tests)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # an attempt ended or the state changed

    def __getstate__(self) -> dict:
        """Picklable (a method holding a client is handed to the rollout manager actor): the state without
        the lock; attempts in flight stay with the process that made them."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_changed")}
        state.update(_in_flight=0, _probe_out=False)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def in_flight(self) -> int:
        """Attempts admitted and not yet recorded (for logs and tests)."""
        with self._lock:
            return self._in_flight

    def allow(self) -> bool:
        """Whether an attempt may be made now (in half-open state: only the one probe). While closed, an
        attempt that could make the failures exceed `failures` if all in flight failed waits for one of
        them to end instead: refusing it would report an open breaker for an endpoint that may be fine."""
        with self._changed:
            while True:
                self._cool_down_ended()
                if self._state == CLOSED and self._consecutive + self._in_flight < self.failures:
                    self._in_flight += 1
                    return True
                if self._state == HALF_OPEN and not self._probe_out:
                    self._probe_out, self._in_flight = True, self._in_flight + 1
                    return True
                if self._state != CLOSED:
                    return False
                self._changed.wait()

    def _cool_down_ended(self) -> None:
        """Open -> half-open once the cool-down has passed (called with the lock held)."""
        if self._state == OPEN and self.clock() - self._opened_at >= self.cooldown_s:
            self._state, self._probe_out = HALF_OPEN, False

    def _end_attempt(self) -> None:
        """One admitted attempt is over (called with the lock held). Not below 0: recording without
        `allow()` first (tests, callers that do not gate) is allowed."""
        self._in_flight = max(0, self._in_flight - 1)
        self._changed.notify_all()

    def record_success(self) -> None:
        """The endpoint answered: close the breaker and forget earlier failures."""
        with self._changed:
            self._end_attempt()
            self._state, self._consecutive, self._probe_out = CLOSED, 0, False

    def record_failure(self) -> None:
        """A failed attempt (timeout, connection error, 429/5xx): open after `failures` in a row, or at
        once when the half-open probe fails."""
        with self._changed:
            self._end_attempt()
            self._consecutive += 1
            if self._state == HALF_OPEN or (self._state == CLOSED and self._consecutive >= self.failures):
                self._state, self._opened_at, self._probe_out = OPEN, self.clock(), False
                self.opened += 1

    def release(self) -> None:
        """An admitted attempt that ended with neither an answer nor a failure of the endpoint (the caller
        was interrupted): free its slot so that waiting callers are not blocked for ever, and let a
        half-open breaker send another probe."""
        with self._changed:
            self._end_attempt()
            if self._state == HALF_OPEN:
                self._probe_out = False
