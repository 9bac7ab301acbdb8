"""Latency under load: many requests sent at once through one client, each one's completion time."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.server_path_parts.workload import make_requests, ragged_lengths


def latency_under_load(pool: Any, prompt_ids: list[list[int]], n: int, count: int, max_len: int,
                       temperature: float) -> dict[str, Any]:
    """`count` requests (prompts cycled, `n` samples each, ragged caps) sent at once through the pool's one
    client (its max_concurrency should be >= count: all in flight at once); each request's completion time from
    the start (client side; the rows of a batched call complete with the call), and their distribution."""
    client = pool.clients[0]
    done: list[float] = []
    request = client._request
    groups = -(-count // n)
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(groups)]
    reqs = make_requests(prompts, n, ragged_lengths(groups * n, max_len, seed=2), temperature, "load")[:count]
    pool.flush_cache()
    t0 = time.perf_counter()

    def traced_request(method: str, path: str, payload: Any = None, timeout: Any = None, headers: Any = None) -> Any:
        out = request(method, path, payload, timeout, headers)
        if path == "/generate":  # a batch answers all its rows at once
            rows = len(payload["rid"]) if isinstance(payload.get("rid"), list) else 1
            done.extend([time.perf_counter() - t0] * rows)
        return out

    client._request = traced_request
    try:
        out = pool.generate(reqs)
    finally:
        client._request = request
    seconds = time.perf_counter() - t0
    done.sort()
    q = lambda f: done[min(len(done) - 1, int(f * len(done)))]  # noqa: E731
    return {"requests": len(reqs), "client_max_concurrency": client.max_concurrency, "seconds": seconds,
            "generated_tokens": sum(len(r.output_ids) for r in out), "p10_s": q(0.1), "p50_s": q(0.5),
            "p90_s": q(0.9), "max_s": done[-1], "median_over_max": q(0.5) / done[-1], "completions_s": done}
