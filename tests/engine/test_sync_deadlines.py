"""Every sync has a deadline: a hung engine and a rank that never sends stop the run within it, named."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slime_ext.engine.failures import WeightSyncError
from slime_ext.engine.sync_deadline import checkpoint_bytes, derived_deadline_s, sync_deadline_s

HANG_S = 30.0  # a hung handler returns after this, bounded (the deadlines under test are ~1 s)


class _HangingEngine(BaseHTTPRequestHandler):
    """Answers SGLang's control routes at once, except the ones named in `server.hang`, which it holds."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in self.server.hang:  # type: ignore[attr-defined]
            self.server.hung.set()  # type: ignore[attr-defined]
            self.server.release.wait(HANG_S)  # type: ignore[attr-defined]
        body = json.dumps({"success": True, "message": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hanging_engine():
    def start(*paths: str):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _HangingEngine)
        server.daemon_threads = True
        server.hang, server.hung, server.release = set(paths), threading.Event(), threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    started: list = []
    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


def _named() -> list:
    return [(f"model.layers.{i}.mlp.gate.weight", torch.randn(4, 8)) for i in range(3)]


def test_the_derived_deadline_grows_with_the_checkpoint(tmp_path):
    assert derived_deadline_s(0) == 120.0
    assert derived_deadline_s(61 * 10**9) == pytest.approx(120 + 610)  # Qwen3-30B-A3B in bf16
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_bytes(tmp_path) == 3000
    assert sync_deadline_s(None, tmp_path) == pytest.approx(120 + 10 * 3000 / 1e9)
    assert sync_deadline_s(7.5, tmp_path) == 7.5  # sglang.weight_sync_timeout_s wins


@pytest.mark.parametrize("hang", ["/update_weights_from_tensor", "/update_weight_version"])
def test_an_engine_that_hangs_in_a_sync_stops_it_within_the_deadline(tmp_path, hanging_engine, hang):
    from slime_ext.config.sections import SGLangConfig
    from slime_ext.engine.server_pool import ServerEnginePool
    from slime_ext.engine.weight_sync import LocalWeightSource
    from slime_ext.orchestration.training_job import stop_on_actor_failure
    from slime_ext.orchestration.run_dir import RunStopped

    server, url = hanging_engine(hang)
    cfg = SGLangConfig(weight_sync="tensor", weight_sync_timeout_s=1.0)
    actor = SimpleNamespace(restart_count=lambda: 0)
    pool = ServerEnginePool([actor], [url], cfg, str(tmp_path / "weights"), client_kwargs={"validate": False})
    t0 = time.monotonic()
    with pytest.raises(RunStopped) as stopped:
        with stop_on_actor_failure("step 3", tmp_path, tmp_path / "checkpoints"):
            pool.sync_weights(LocalWeightSource(_named()), "4")
    elapsed = time.monotonic() - t0
    assert server.hung.is_set() and elapsed < 10.0, elapsed  # the deadline (1 s), not the handler's 30 s
    message = str(stopped.value)
    assert url in message and "during step 3" in message and "Resume with:" in message, message


def test_a_rank_that_never_sends_stops_the_sync_within_the_deadline():
    import ray

    from slime_ext.orchestration.train_group import wait_for_ranks

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        @ray.remote(num_cpus=0)
        def push(rank: int) -> dict:
            if rank == 1:
                time.sleep(HANG_S)  # never sends within the deadline
            return {"rank": rank}

        futures = [push.remote(r) for r in range(3)]
        assert wait_for_ranks([push.remote(r) for r in (0, 2)], 30.0, "a push") == [{"rank": 0}, {"rank": 2}]
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"trainer rank\(s\) \[1\] of 3 did not finish the push of weights 5 "
                                                  r"within 2 s \(sglang.weight_sync_timeout_s\)"):
            wait_for_ranks(futures, 2.0, "the push of weights 5")
        assert time.monotonic() - t0 < 15.0
        for f in futures:
            ray.cancel(f, force=True)
    finally:
        ray.shutdown()
