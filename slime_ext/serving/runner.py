"""Running the app on uvicorn: in-process on a thread (tests, `solver:` endpoints) or as the CLI's server.

The listening socket is bound before uvicorn starts, so an ephemeral port (0) is known at once and the
backlog is ours (uvicorn's default is 2048; the old server's 5 dropped connections under load).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from slime_ext.serving.app import build_app
from slime_ext.serving.http_protocol import protocol_with_header_timeout
from slime_ext.serving.state import ServerState


def uvicorn_config(state: ServerState, log_level: str = "warning") -> uvicorn.Config:
    cfg = state.config
    return uvicorn.Config(
        build_app(state), loop="asyncio", http=protocol_with_header_timeout(cfg.header_timeout_s), lifespan="off",
        log_config=None, log_level=log_level, access_log=False, timeout_keep_alive=int(max(1, cfg.keep_alive_s)),
        limit_concurrency=cfg.max_connections, backlog=cfg.backlog, timeout_graceful_shutdown=3)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class RunningServer:
    """A server on a background thread. `server_address` and `shutdown()` match the old
    ThreadingHTTPServer handle, so existing callers keep working."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket, thread: threading.Thread):
        self.server, self._sock, self._thread = server, sock, thread
        self.host, self.port = sock.getsockname()[:2]

    @property
    def server_address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()

    stop = shutdown


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
          start_timeout_s: float = 30.0) -> RunningServer:
    """Start the server on a daemon thread and return once it accepts connections."""
    sock = bind(host, port)
    server = uvicorn.Server(uvicorn_config(state, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="serve-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the server on {host}:{port} did not start within {start_timeout_s:g}s")
        time.sleep(0.01)
    return RunningServer(server, sock, thread)


def serve_forever(state: ServerState, host: str, port: int, log_level: str = "info") -> None:
    """Serve in this thread until SIGINT/SIGTERM (the CLI)."""
    uvicorn.Server(uvicorn_config(state, log_level)).run(sockets=[bind(host, port)])


__all__ = ["RunningServer", "serve", "serve_forever", "uvicorn_config", "bind"]
