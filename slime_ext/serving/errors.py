"""OpenAI-shaped errors: every refusal the server makes is `{"error": {message, type, param, code}}`.

Clients (ours and OpenAI's SDKs) read `error.message` and decide on retries from the status alone, so
every path that refuses a request raises `APIError` and one handler renders it.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi.responses import JSONResponse


class APIError(Exception):
    """A refusal with an HTTP status and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str, retry_after_s: int) -> APIError:
    """429: the server is at its concurrency and queue limits; retry later (clients back off on 429)."""
    return APIError(429, message, type="rate_limit_error", code="server_overloaded",
                    headers={"Retry-After": str(max(1, int(retry_after_s)))})
