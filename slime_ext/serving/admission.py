"""Bounded concurrency with a bounded wait queue: overload is answered with 429, never a dropped socket.

At most `max_concurrency` requests are past admission (tokenising, queued in the batcher or generating);
up to `max_queue` more wait in FIFO order for a slot, each at most `queue_timeout_s`. A request that finds
the queue full, or waits too long, gets a 429 with `Retry-After`. Runs on the event loop only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import AsyncIterator, Callable

from slime_ext.serving.errors import bad_request, overloaded


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, queue_timeout_s: float):
        self.max_concurrency, self.max_queue, self.queue_timeout_s = int(max_concurrency), int(max_queue), float(queue_timeout_s)
        self.active = 0
        # waiting acquisitions in FIFO order: (future, slots); a batch of n requests takes n slots at once
        self._waiters: "collections.deque[tuple[asyncio.Future[None], int]]" = collections.deque()
        self.admitted = self.refused = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self, n: int = 1) -> AsyncIterator[None]:
        """Hold `n` slots for the body of the `async with` (released on errors and cancellation too)."""
        release = await self.acquire(n)
        try:
            yield
        finally:
            release()

    async def acquire(self, n: int = 1) -> Callable[[], None]:
        """Take `n` slots at once (waiting in the queue, or 429); returns their release function
        (idempotent), for holders that outlive one scope, e.g. a streamed response. Taking a batch's slots
        together, never one by one, is what keeps batches from each holding part and waiting for the rest."""
        if n > self.max_concurrency:
            raise bad_request(f"a batch of {n} requests is more than this server runs at once "
                              f"(--max-concurrency {self.max_concurrency}): send smaller batches",
                              param="input_ids")
        await self._acquire(n)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(n)

        return release

    async def _acquire(self, n: int) -> None:
        if self.active + n <= self.max_concurrency and not self._waiters:
            self.active += n
            self.admitted += n
            return
        if len(self._waiters) >= self.max_queue:
            self.refused += n
            raise overloaded(f"server busy: {self.active} requests running and {len(self._waiters)} queued "
                             f"(limits --max-concurrency {self.max_concurrency}, --max-queue {self.max_queue})",
                             retry_after_s=1)
        waiter: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        entry = (waiter, n)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():  # the slots were granted just now: give them back
                self._release(n)
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()  # a smaller request behind this one may fit now
            if isinstance(exc, asyncio.TimeoutError):
                self.refused += n
                raise overloaded(f"server busy: no slot within {self.queue_timeout_s:g}s (--queue-timeout)",
                                 retry_after_s=max(1, self.queue_timeout_s / 10)) from None
            raise
        self.admitted += n  # granted by a release (counted in `active` there)

    def _release(self, n: int) -> None:
        self.active -= n
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to the waiters in FIFO order, as far as the oldest one fits."""
        while self._waiters:
            waiter, n = self._waiters[0]
            if waiter.done():  # cancelled: its owner removes it, or it was already granted
                self._waiters.popleft()
                continue
            if self.active + n > self.max_concurrency:
                return
            self._waiters.popleft()
            self.active += n
            waiter.set_result(None)
