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

from slime_ext.serving.errors import overloaded


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, queue_timeout_s: float):
        self.max_concurrency, self.max_queue, self.queue_timeout_s = int(max_concurrency), int(max_queue), float(queue_timeout_s)
        self.active = 0
        self._waiters: "collections.deque[asyncio.Future[None]]" = collections.deque()
        self.admitted = self.refused = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the body of the `async with` (released on errors and cancellation too)."""
        release = await self.acquire()
        try:
            yield
        finally:
            release()

    async def acquire(self) -> Callable[[], None]:
        """Take a slot (waiting in the queue, or 429); returns its release function (idempotent), for
        holders that outlive one scope, e.g. a streamed response."""
        await self._acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release()

        return release

    async def _acquire(self) -> None:
        if self.active < self.max_concurrency and not self._waiters:
            self.active += 1
            self.admitted += 1
            return
        if len(self._waiters) >= self.max_queue:
            self.refused += 1
            raise overloaded(f"server busy: {self.active} requests running and {len(self._waiters)} queued "
                             f"(limits --max-concurrency {self.max_concurrency}, --max-queue {self.max_queue})",
                             retry_after_s=1)
        waiter: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():  # the slot was handed over just now: pass it on
                self._release()
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                self.refused += 1
                raise overloaded(f"server busy: no slot within {self.queue_timeout_s:g}s (--queue-timeout)",
                                 retry_after_s=max(1, self.queue_timeout_s / 10)) from None
            raise
        self.admitted += 1  # the releasing request handed its slot over (active unchanged)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the oldest waiter
                return
        self.active -= 1
