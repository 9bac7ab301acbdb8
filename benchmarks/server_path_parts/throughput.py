"""Rollout throughput: interleaved, cache-flushed runs of the same workload in-process and through each
server pool; best run per side and whether the server path generates the in-process tokens."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.server_path_parts.workload import make_requests


def timed(fn: Any, requests: list) -> tuple[float, list]:
    """(seconds, results) of `fn(requests)`."""
    start = time.perf_counter()
    out = fn(requests)
    return time.perf_counter() - start, out


def throughput(engine: Any, pools: dict[str, Any], prompt_ids: list[list[int]], n: int, lengths: list[int],
               temperature: float, repeats: int) -> tuple[dict, dict]:
    """Interleaved runs of every side; returns (per side: best seconds, tokens, tokens/s, all runs) and
    the share of requests whose tokens match the in-process run's."""
    sides = {"in_process": engine.generate, **{k: p.generate for k, p in pools.items()}}
    flush = {"in_process": engine.flush_cache, **{k: p.flush_cache for k, p in pools.items()}}
    warm = make_requests(prompt_ids[:2], 2, [4] * 4, temperature, "warm")
    for name, fn in sides.items():
        fn(warm)
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in sides}
    reference: dict[str, list[int]] = {}
    same: dict[str, list[float]] = {k: [] for k in pools}
    for rep in range(repeats):
        for name, fn in sides.items():
            flush[name]()
            reqs = make_requests(prompt_ids, n, lengths, temperature, f"r{rep}")
            seconds, out = timed(fn, reqs)
            bad = [r for r in out if r.finish_reason not in ("stop", "length")]
            if bad:
                raise RuntimeError(f"{name}: {len(bad)} request(s) finished {bad[0].finish_reason}: {bad[0].error}")
            runs[name].append((seconds, sum(len(r.output_ids) for r in out)))
            ids = {r.rid: r.output_ids for r in out}
            if name == "in_process":
                reference = ids
            else:
                same[name].append(sum(ids[k] == v for k, v in reference.items()) / len(reference))
            print(f"[bench] repeat {rep} {name}: {runs[name][-1][1]} tokens in {seconds:.2f} s "
                  f"({runs[name][-1][1] / seconds:.0f} tokens/s)", flush=True)
    results = {}
    for name, values in runs.items():
        seconds, tokens = min(values)
        results[name] = {"seconds": seconds, "generated_tokens": tokens, "tokens_per_s": tokens / seconds,
                         "all_seconds": [v[0] for v in values], "all_tokens": [v[1] for v in values]}
    return results, {k: min(v) for k, v in same.items()}
