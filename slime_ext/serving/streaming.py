"""Bridging the batcher thread to the event loop: awaited results and token streams.

The engine's `on_token` callback runs on the batcher thread; tokens cross to the loop with
`call_soon_threadsafe`. A request whose client goes away is aborted in the batcher (dropped if still
queued, stopped at the next step if running) and its admission slot is released.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Optional

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.serving.batcher import Batcher, Ticket
from slime_ext.serving.body import wait_unless_disconnected


async def generate_all(batcher: Batcher, request: Request, reqs: Optional[list[GenerateRequest]] = None,
                       tickets: Optional[list[Ticket]] = None) -> list[GenerateResult]:
    """Results of `reqs` (batched with everyone else's), or of `tickets` already submitted; aborts them if
    the client disconnects first."""
    tickets = tickets if tickets is not None else [batcher.submit(r) for r in reqs or []]
    gathered = asyncio.gather(*(asyncio.wrap_future(t.future) for t in tickets))
    try:
        return await wait_unless_disconnected(request, gathered)
    finally:
        for t in tickets:
            if not t.future.done():
                batcher.abort_ticket(t)
        if not gathered.done():
            gathered.cancel()


class TokenStream:
    """One streamed request: `async for tok in stream` yields its tokens; `result()` after the end."""

    def __init__(self, batcher: Batcher, req: GenerateRequest):
        self._loop = asyncio.get_running_loop()
        self._queue: "asyncio.Queue[Optional[int]]" = asyncio.Queue()
        self._closed = False
        self.batcher = batcher
        self.ticket: Ticket = batcher.submit(req, on_token=self._put)
        self.ticket.future.add_done_callback(lambda _: self._put(None))

    def _put(self, item: Optional[int]) -> None:  # batcher thread
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shut down)
            self._closed = True

    async def __aiter__(self) -> AsyncIterator[int]:
        while (tok := await self._queue.get()) is not None:
            yield tok

    def result(self) -> GenerateResult:
        return self.ticket.future.result()

    def close(self) -> None:
        """Stop the request if it is still live (the client left) and ignore further tokens."""
        self._closed = True
        if not self.ticket.future.done():
            self.batcher.abort_ticket(self.ticket)


class SSEResponse(StreamingResponse):
    """Server-sent events whose `on_close` runs however the response ends: finished, failed, or the
    client disconnected (Starlette then cancels the body iterator, possibly before it ever started)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Any]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except OSError:  # the client went away while we wrote
            pass
        finally:
            self._on_close()
