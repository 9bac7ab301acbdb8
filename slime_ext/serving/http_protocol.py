"""uvicorn's HTTP protocol with a deadline for a connection's first request.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) but arms that timer only after a
response; a client that connects and then sends nothing, or headers byte by byte, would hold its socket
forever. Here such a connection is closed once `header_timeout_s` passes without a complete request.

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


def protocol_with_header_timeout(header_timeout_s: float) -> type[BaseProtocol]:
    class HeaderTimeoutProtocol(BaseProtocol):
        _first_request_timer: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._first_request_timer = self.loop.call_later(header_timeout_s, self._close_if_silent)

        def _close_if_silent(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._first_request_timer is not None:
                self._first_request_timer.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
