"""The HTTP transport of the SGLang client: one JSON request to a server, its errors and how they are retried.

An error status comes back as `HTTPStatusError` (status and body); transport errors (connection, timeout)
raise as urllib raises them. `is_retryable` is the project's retry rule (`slime_ext.clients.retry`) for
these errors; `is_timeout` tells a timed-out attempt (the client aborts it on the server before a retry).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any, Optional

from slime_ext.clients.retry import is_retryable as _is_retryable


class HTTPStatusError(RuntimeError):
    """A response with an error status from an SGLang(-protocol) server."""

    def __init__(self, status: int, body: str, url: str):
        super().__init__(f"HTTP {status} from {url}: {body[:500]}")
        self.status = status
        self.body = body


def is_retryable(exc: BaseException) -> bool:
    """429 and 5xx responses and transport errors are retried; any other status is final."""
    return _is_retryable(exc, exc.status if isinstance(exc, HTTPStatusError) else None)


def is_timeout(exc: BaseException) -> bool:
    """The attempt timed out (directly, or as the reason of urllib's URLError)."""
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return True
    return isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, (TimeoutError, socket.timeout))


def request_json(method: str, url: str, payload: Any = None, *, timeout: float,
                 headers: Optional[dict[str, str]] = None, api_key: Optional[str] = None) -> Any:
    """One request, `payload` sent as JSON; the decoded JSON body (the text when it is not JSON, None when
    empty). `api_key` is sent as `Authorization: Bearer`."""
    data = None if payload is None else json.dumps(payload).encode()
    headers = dict(headers or {})
    if data is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise HTTPStatusError(exc.code, exc.read().decode(errors="replace"), url) from None
    if not body:
        return None
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return body


__all__ = ["HTTPStatusError", "is_retryable", "is_timeout", "request_json"]
