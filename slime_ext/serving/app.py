"""The ASGI application: `build_app(state)` wires routes, the API key check and OpenAI-shaped errors.

Routes live in routers (`openai_routes`, `native_routes`, `weight_routes`: model info and weight
updates). Any refusal is an `APIError`; anything unexpected is a 500 in the
same shape, and the server keeps serving.
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from slime_ext.serving import native_routes, openai_routes, weight_routes
from slime_ext.serving.body import ClientGone
from slime_ext.serving.errors import APIError
from slime_ext.serving.memory import TrimAfterLargeBodies
from slime_ext.serving.state import ServerState

log = logging.getLogger(__name__)
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key (liveness probes)


class APIKeyMiddleware:
    """401 for any request without `Authorization: Bearer <key>` when the server has a key."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.state.authorized(header):
                err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(state: ServerState, routers: Optional[Iterable[APIRouter]] = None) -> FastAPI:
    """The FastAPI app over `state` (routes find it at `request.app.state.serve`)."""
    app = FastAPI(title="slime_ext serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    for router in routers or (openai_routes.router, native_routes.router, weight_routes.router):
        app.include_router(router)
    app.add_middleware(APIKeyMiddleware, state=state)
    app.add_middleware(TrimAfterLargeBodies)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, __: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the client closed the connection

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return APIError(exc.status_code, message, type=kind, code=kind, headers=dict(exc.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        return APIError(400, f"invalid request: {exc.errors()[:3]}", code="invalid_value").response()

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> Response:
        log.error("request failed", exc_info=exc)
        return APIError(500, f"{type(exc).__name__}: {exc}", type="server_error", code="internal_error").response()

    return app
