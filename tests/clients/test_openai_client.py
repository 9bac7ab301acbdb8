"""OpenAIClient against a local HTTP server that fails on purpose: retries with backoff on 5xx, the
attempt count in the error, failures returned in their slot by chat_many. (Against the project's server:
tests/serving/test_serve.py; with the circuit breaker: tests/methods/test_dagrpo.py.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime_ext.clients.openai_client import CallFailed, OpenAIClient

MSG = [{"role": "user", "content": "what is 1 + 2?"}]


def test_client_retries_server_errors_with_backoff_and_reports_failures():
    calls = {"n": 0}

    class Flaky(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            calls["n"] += 1
            if calls["n"] < 3:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = OpenAIClient(f"http://127.0.0.1:{srv.server_address[1]}", max_retries=3, backoff_s=0.01)
        res = client.chat(MSG)
        assert res.text == "ok" and res.attempts == 3 and client.stats["retries"] == 2
        calls["n"] = -10  # more failures than retries
        with pytest.raises(CallFailed, match="after 3 attempt"):
            OpenAIClient(f"http://127.0.0.1:{srv.server_address[1]}", max_retries=2, backoff_s=0.01).chat(MSG)
    finally:
        srv.shutdown()
    dead = OpenAIClient("http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2)
    (failed,) = dead.chat_many([MSG])
    assert isinstance(failed, CallFailed) and "127.0.0.1:9" in str(failed)
