"""Giving the heap back to the OS after large request bodies.

Why: glibc keeps memory freed by Python in its arenas (per thread, and tokenising runs on pool threads),
so a burst of large bodies leaves the server's RSS high long after they were answered. `malloc_trim(0)`
returns the free pages of every arena. It is called after a request whose body was at least
`LARGE_BODY_BYTES`, off the event loop, once the answer is sent; elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from typing import Any, Callable, Optional

from starlette.types import ASGIApp, Receive, Scope, Send

LARGE_BODY_BYTES = 1 << 20
STATE_KEY = "body_bytes"  # request.state.body_bytes: the size of the body read (set by the body readers)


def _load_trim() -> Optional[Callable[[int], Any]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # absent from musl
    except (OSError, AttributeError):
        return None


_TRIM = _load_trim()


def trim_heap() -> bool:
    """Return freed heap pages to the OS (glibc); False where that is not available."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class TrimAfterLargeBodies:
    """ASGI middleware: after a request whose body was large, trim the heap on a worker thread."""

    def __init__(self, app: ASGIApp, threshold: int = LARGE_BODY_BYTES):
        self.app, self.threshold = app, threshold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and scope.get("state", {}).get(STATE_KEY, 0) >= self.threshold:
                await asyncio.to_thread(trim_heap)
