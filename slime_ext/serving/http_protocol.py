"""uvicorn's HTTP protocol with a deadline for a connection's first request and a lingering close.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) but arms that timer only after a
response; a client that connects and then sends nothing, or headers byte by byte, would hold its socket
forever. Here such a connection is closed once `header_timeout_s` passes without a complete request.

A request refused before its body is read (over `--max-request-bytes`) is answered while the client may
still be sending. Closing a socket with unread bytes makes the kernel send a reset, and a client that gets
the reset before it reads the answer loses it (httpx: "Connection reset by peer" instead of the 400 that
names the limit; seen in CI). So such a connection closes the way HTTP servers do it (RFC 9112 section
9.6): the answer is sent, the write side shut, and what the client still sends is read and dropped, without
keeping it, until the client closes or `linger_s` passes.

The parser is httptools (uvicorn's fast one, as `uvicorn[standard]` and SGLang's server use) where it is
installed, else h11: on an engine server the event loop shares the GIL with the engine's decode thread, and
h11's pure-Python parsing was the largest part of the loop's share (py-spy, issue 28).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as BaseProtocol
except ImportError:  # httptools missing: the pure-Python parser
    from uvicorn.protocols.http.h11_impl import H11Protocol as BaseProtocol

LINGER_S = 5.0  # the longest a refused client may go on sending before its connection is closed


class LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` lingers while a request body is unread."""

    def __init__(self, transport: asyncio.Transport, body_unread: Any, loop: asyncio.AbstractEventLoop,
                 linger_s: float) -> None:
        self._transport = transport
        self._body_unread = body_unread
        self._loop = loop
        self._linger_s = linger_s
        self._closing = False
        self._timer: Optional[asyncio.TimerHandle] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    @property
    def lingering(self) -> bool:
        return self._timer is not None

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._transport.is_closing() or not self._body_unread() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self._transport.write_eof()  # the answer is flushed first, then FIN
        self._transport.resume_reading()  # uvicorn paused reading while the body was not consumed
        self._timer = self._loop.call_later(self._linger_s, self._transport.close)

    def connection_lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def protocol_with_header_timeout(header_timeout_s: float, linger_s: Optional[float] = None) -> type[BaseProtocol]:
    linger_s = LINGER_S if linger_s is None else linger_s

    class HeaderTimeoutProtocol(BaseProtocol):
        _first_request_timer: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(LingeringTransport(transport, self._request_body_unread, self.loop, linger_s))
            self._first_request_timer = self.loop.call_later(header_timeout_s, self._close_if_silent)

        def _request_body_unread(self) -> bool:
            return self.cycle is not None and bool(self.cycle.more_body)

        def _close_if_silent(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering:  # connection_made wrapped it
                return  # the rest of a refused body: dropped, never parsed or kept
            super().data_received(data)

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._first_request_timer is not None:
                self._first_request_timer.cancel()
            self.transport.connection_lost()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
