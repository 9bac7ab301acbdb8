"""uvicorn's h11 protocol with a deadline for a connection's first request.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) but arms that timer only after a
response; a client that connects and then sends nothing, or headers byte by byte, would hold its socket
forever. Here such a connection is closed once `header_timeout_s` passes without a complete request.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from uvicorn.protocols.http.h11_impl import H11Protocol


def protocol_with_header_timeout(header_timeout_s: float) -> type[H11Protocol]:
    class HeaderTimeoutH11Protocol(H11Protocol):
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

    return HeaderTimeoutH11Protocol
