"""Reading a request body without trusting the client: size capped before and while reading, time bounded.

The old server read `Content-Length` bytes into memory whatever they were; a 150k-token chat grew it to
24 GB. Here a declared length over the limit is refused before a byte is read, a malformed one is
refused, and a body without a length (chunked) is counted as it streams and cut off at the limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from slime_ext.serving.errors import APIError, bad_request
from slime_ext.serving.memory import STATE_KEY as BODY_BYTES_KEY


class ClientGone(Exception):
    """The client disconnected before its request was answered."""


def declared_length(request: Request, limit: int) -> int | None:
    """The Content-Length header checked against `limit` (None if absent)."""
    raw = request.headers.getlist("content-length")
    if not raw:
        return None
    if len(set(raw)) > 1:
        raise bad_request("conflicting Content-Length headers", code="invalid_content_length")
    text = raw[0].strip()
    if not text.isdigit():  # rejects negatives, signs, blanks and non-numbers alike
        raise bad_request(f"Content-Length must be a non-negative integer, got {text[:40]!r}",
                          code="invalid_content_length")
    length = int(text)
    if length > limit:
        raise too_large(limit, f"Content-Length {length}")
    return length


def too_large(limit: int, what: str) -> APIError:
    return APIError(400, f"request body too large: {what} exceeds the limit of {limit} bytes "
                         f"(--max-request-bytes)", param=None, code="request_too_large",
                    headers={"Connection": "close"})


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most `limit` bytes, received within `timeout_s`."""
    declared_length(request, limit)

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit, "the streamed body")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        body = await asyncio.wait_for(collect(), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"request body not received within {timeout_s:g}s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise ClientGone() from None
    setattr(request.state, BODY_BYTES_KEY, len(body))  # large bodies: the heap is trimmed after the answer
    return body


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object or a 400 (invalid JSON, NaN/Infinity, absurd nesting or numbers, non-objects)."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, huge int literals, deep nesting
        raise bad_request(f"request body is not valid JSON: {str(exc)[:200]}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return body


async def wait_unless_disconnected(request: Request, fut: "asyncio.Future[Any]") -> Any:
    """`await fut`, but raise `ClientGone` as soon as the client disconnects (the body has been read)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({fut, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if fut in done:
        return fut.result()
    raise ClientGone()
