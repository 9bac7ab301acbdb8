"""Where the server path's time goes: a server whose batcher logs every generate call and the requests'
arrivals (`serve_traced`, run in the server process), and one traced run of the workload (`profile_server`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.server_path_parts.throughput import timed
from benchmarks.server_path_parts.workload import make_requests

TRACE_FLAG = "--serve-traced"


def serve_traced(argv: list[str]) -> int:
    """`python -m slime_ext.tools.serve` with the batcher traced: every generate call appends
    {start, size, seconds, arrivals (submit times since the previous call)} to the file argv[0]."""
    from slime_ext.serving import batcher as B
    from slime_ext.tools.serve import main as serve_main

    log, arrivals = argv[0], []
    submit, run = B.Batcher.submit, B.Batcher._run

    def traced_submit(self: Any, request: Any, on_token: Any = None) -> Any:
        arrivals.append(time.time())
        return submit(self, request, on_token)

    def traced_run(self: Any, items: list) -> None:
        start, seen = time.time(), arrivals[:]
        del arrivals[:len(seen)]
        run(self, items)
        with open(log, "a") as f:
            f.write(json.dumps({"start": start, "size": len(items), "seconds": time.time() - start,
                                "arrivals": seen}) + "\n")

    B.Batcher.submit, B.Batcher._run = traced_submit, traced_run
    return serve_main(argv[1:])


def profile_server(pool: Any, trace_log: Path, prompt_ids: list[list[int]], n: int, lengths: list[int],
                   temperature: float) -> dict[str, Any]:
    """One run of the workload through a traced server: when the client sent, when the server's batcher
    got each request, the generate calls it made, and the tail (responses back to the client)."""
    client = pool.clients[0]
    sent: list[float] = []
    request = client._request

    def traced_request(method: str, path: str, payload: Any = None, timeout: Any = None, headers: Any = None) -> Any:
        if path == "/generate":
            sent.append(time.time())
        return request(method, path, payload, timeout, headers)

    pool.generate(make_requests(prompt_ids[:2], 2, [4] * 4, temperature, "pwarm"))
    pool.flush_cache()
    trace_log.unlink(missing_ok=True)
    client._request = traced_request
    try:
        t0 = time.time()
        seconds, out = timed(pool.generate, make_requests(prompt_ids, n, lengths, temperature, "prof"))
    finally:
        client._request = request
    tokens = sum(len(r.output_ids) for r in out)
    deadline = time.time() + 10
    calls: list[dict] = []
    while time.time() < deadline:  # the last record is written right after the last call returns
        calls = [json.loads(x) for x in trace_log.read_text().splitlines()] if trace_log.exists() else []
        if sum(c["size"] for c in calls) >= len(out):
            break
        time.sleep(0.05)
    arrived = sorted(a for c in calls for a in c["arrivals"])
    last_end = max((c["start"] + c["seconds"] - t0 for c in calls), default=0.0)
    gaps = [b - a for a, b in zip(arrived, arrived[1:])]
    return {
        "seconds": seconds, "generated_tokens": tokens, "tokens_per_s": tokens / seconds,
        "client_sends_s": [min(sent) - t0, max(sent) - t0] if sent else None,
        "server_arrivals_s": [arrived[0] - t0, arrived[-1] - t0] if arrived else None,
        "arrival_gap_max_s": max(gaps, default=0.0),
        "calls": [{"start_s": c["start"] - t0, "size": c["size"], "seconds": c["seconds"]} for c in calls],
        "tail_s": seconds - last_end,
    }
