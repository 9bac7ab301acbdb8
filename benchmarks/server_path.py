"""The engine-server path vs the in-process engine: rollout throughput and the weight sync's share of a step.

1. Throughput. The default job's model (the embedded default Qwen3-MoE, random weights, saved as an HF
   dir with a tokenizer trained on the default task's text) and the default RL rollout workload
   (`rollout.prompts_per_step` synthetic-math L2 prompts x `n_samples_per_prompt` identical requests,
   temperature 1, `max_response_len` 160, return_logprob as the loop asks; ragged lengths as in
   benchmarks/decode.py: request i may stop at a length drawn from [max_len/8, max_len], or earlier at
   EOS) generated
   (a) in-process: one `EmbeddedEngine.generate` call (what `rollout.engine: embedded` does per step);
   (b) through `ServerEnginePool` with 1 engine server (`python -m slime_ext.tools.serve`, one HTTP
       request per rollout, the server batches concurrent requests);
   (c) the same with 2 servers (on a 2-core machine they share the cores with each other and with this
       process's client threads: no speedup is expected there).
   (b') 1 server with the client's former default of 64 requests in flight (`--compare-concurrency`).
   (b'') 1 server started with `--no-continuous-batching` (`--compare-static`): every generate call runs its
       batch to the end, requests arriving meanwhile wait for the next call (the server before issue 28).
   With `--load-requests N`, N requests are also sent at once to (b) and (b''): each one's completion time,
   the latency distribution under load (median against max).
   One torch thread everywhere. Repeats are interleaved, every prefix cache is flushed before each run
   (as a weight update does every step), the best run of each is kept. Generated tokens/s and the ratios
   (b)/(a), (c)/(a); the issue's target is (b)/(a) >= 0.85. Then one traced run through a server whose
   batcher logs its `engine.generate` calls and the requests' arrival times: where the time goes.
2. Weight sync. `ServerEnginePool.sync_weights` of the model's HF-named weights (its safetensors) to one
   server with `sglang.weight_sync` = disk, tensor, distributed (median of `--sync-repeats`), against the
   RL step of the default job on the embedded default, from the committed run's metrics
   (results/grpo_default/run_2026-11-21/metrics.jsonl: trained model, natural EOS; median step). The
   embedded engine's own sync (export + an in-process copy through Ray) is that run's time/sync. A server
   path's sync in the loop is export + snapshot + push, so its share is (export + snapshot + push) /
   (step - embedded sync + export + snapshot + push). The export (the trainer's, the same for every
   engine) comes from `--measure-step`: one fresh run of the driver for 2 RL steps (untrained model:
   responses run to the length limit), reported beside with its own step and shares; without it the
   export is bounded by the committed time/sync (those metrics predate time/sync_export).

    python benchmarks/server_path.py [--repeats 3] [--measure-step] [--out results/benchmarks]
    python benchmarks/server_path.py --dry-run --out /tmp/x     # tiny model and workload (tests)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.server_path_parts.load import latency_under_load  # noqa: E402
from benchmarks.server_path_parts.report import cpu_model, write_report  # noqa: E402
from benchmarks.server_path_parts.servers import make_pool, server_actor, start_servers  # noqa: E402
from benchmarks.server_path_parts.sync import (COMMITTED_METRICS, committed_step, measured_step, shares,  # noqa: E402
                                               sync_times)
from benchmarks.server_path_parts.throughput import throughput  # noqa: E402
from benchmarks.server_path_parts.traced import TRACE_FLAG, profile_server, serve_traced  # noqa: E402
from benchmarks.server_path_parts.workload import (TINY_MODEL, build_model_dir, default_workload,  # noqa: E402
                                                   load_named, ragged_lengths)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync-repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=None, help="default: rollout.prompts_per_step")
    parser.add_argument("--n-samples", type=int, default=None, help="default: rollout.n_samples_per_prompt")
    parser.add_argument("--max-len", type=int, default=None, help="default: rollout.max_response_len")
    parser.add_argument("--measure-step", action="store_true",
                        help="also run the default job for 2 RL steps (its export time, its own step and shares)")
    parser.add_argument("--client-concurrency", type=int, default=None,
                        help="SGLangEngineClient max_concurrency (default: the client's own)")
    parser.add_argument("--servers", default="1,2", help="server counts to run, e.g. 1 or 1,2")
    parser.add_argument("--compare-concurrency", type=int, default=64,
                        help="also run 1 server with this client max_concurrency (64: the client's default "
                             "before this benchmark); 0: skip")
    parser.add_argument("--no-profile", action="store_true", help="skip the traced-server breakdown")
    parser.add_argument("--compare-static", action="store_true",
                        help="also run 1 server with --no-continuous-batching (server_1_static), side by side")
    parser.add_argument("--load-requests", type=int, default=0,
                        help="also send this many requests at once to 1 server (and to server_1_static with "
                             "--compare-static): the latency distribution under load; 0: skip")
    parser.add_argument("--compare-batching", default="",
                        help="also run 1 server with these client batchings (comma list of request, group, call; "
                             "server_1 uses sglang.generate_batching's default), side by side")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, 4x2 requests of 8 tokens, 1 repeat")
    parser.add_argument("--out", type=Path, default=None)
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == TRACE_FLAG:
        return serve_traced(sys.argv[2:])
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    wl = default_workload()
    threads = wl["threads"]
    torch.set_num_threads(threads)
    model_cfg = wl["model"]
    vocab, n_texts = wl["vocab_size"], wl["n_tokenizer_texts"]
    if args.dry_run:
        args.repeats, args.sync_repeats = 1, 1
        args.prompts, args.n_samples, args.max_len = args.prompts or 4, args.n_samples or 2, args.max_len or 8
        model_cfg = model_cfg.model_copy(update=TINY_MODEL)
        vocab, n_texts, args.measure_step = 300, 200, False
        args.compare_concurrency = 0
    prompts = args.prompts or wl["prompts"]
    n = args.n_samples or wl["n"]
    max_len = args.max_len or wl["max_len"]
    client = {} if args.client_concurrency is None else {"max_concurrency": args.client_concurrency}

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tasks.templates import get_template
    from slime_ext.tokenizer import load_tokenizer

    stop_servers: Optional[Callable[[], None]] = None
    with tempfile.TemporaryDirectory(prefix="server_path_") as tmp:
        tmp_path = Path(tmp)
        model_dir = tmp_path / "model"
        try:
            rows = build_model_dir(model_dir, model_cfg, vocab, n_texts)
            tok = load_tokenizer(model_dir)
            template = get_template(wl["template"])
            prompt_ids = [tok(template.format(r["prompt"]))["input_ids"] for r in rows[:prompts]]
            lengths = ragged_lengths(prompts * n, max_len)
            n_params = sum(t.numel() for _, t in load_named(model_dir))
            print(f"[bench] server path: {prompts} x {n} requests, max_len {max_len}, vocab {len(tok)}, "
                  f"{n_params / 1e6:.2f}M parameters, threads {threads}", flush=True)
            engine = EmbeddedEngine.from_pretrained(str(model_dir))
            counts = sorted({int(c) for c in args.servers.split(",")} | {1})
            actors = [server_actor(i, model_dir, tmp_path / "logs", threads) for i in range(max(counts))]
            traced = None if args.no_profile else server_actor(len(actors), model_dir, tmp_path / "logs", threads,
                                                               tmp_path / "trace.jsonl")
            if traced is not None and args.dry_run:  # one server process fewer: the traced one is server 0
                actors[0], traced = traced, None
            stop_servers = start_servers(actors + ([traced] if traced else []))
            pools = {f"server_{c}": make_pool(actors[:c], model_dir, tmp_path / f"w{c}", tok, **client)
                     for c in counts}  # pools share servers: server 0 is in each
            static = server_actor(len(actors) + 1, model_dir, tmp_path / "logs", threads,
                                  extra_args=("--no-continuous-batching",)) if args.compare_static else None
            if static is not None:
                stop_static = start_servers([static])
                previous_stop = stop_servers
                stop_servers = lambda: (stop_static(), previous_stop())  # noqa: E731
                pools["server_1_static"] = make_pool([static], model_dir, tmp_path / "ws", tok, **client)
            for mode in filter(None, args.compare_batching.split(",")):
                pools[f"server_1_{mode}"] = make_pool(actors[:1], model_dir, tmp_path / f"wb_{mode}", tok,
                                                      **{**client, "batching": mode})
            if args.compare_concurrency:
                capped = {**client, "max_concurrency": args.compare_concurrency}
                pools[f"server_1_conc{args.compare_concurrency}"] = make_pool(actors[:1], model_dir, tmp_path / "wc",
                                                                                tok, **capped)
            concurrency = pools["server_1"].clients[0].max_concurrency
            pools_batching = {k: p.clients[0].batching for k, p in pools.items()}
            tp, same = throughput(engine, pools, prompt_ids, n, lengths, wl["temperature"], args.repeats)
            load = {}
            for name, pool_actors in (("server_1", actors[:1]), ("server_1_static", [static] if static else None)):
                if args.load_requests and pool_actors:  # a pool with every request in flight at once
                    # one request per call: the server's own latency per request (with client batching a group's
                    # answer waits for its longest member by design: the loop needs the whole group)
                    wide = make_pool(pool_actors, model_dir, tmp_path / f"wl_{name}", tok,
                                     **{**client, "max_concurrency": max(args.load_requests, 1), "batching": "request"})
                    load[name] = latency_under_load(wide, prompt_ids, n, args.load_requests, max_len,
                                                    wl["temperature"])
                    print(f"[bench] load {name}: {load[name]['requests']} requests in {load[name]['seconds']:.2f} s, "
                          f"median {load[name]['p50_s']:.2f} s, max {load[name]['max_s']:.2f} s", flush=True)
            sync = sync_times(pools["server_1"], load_named(model_dir), args.sync_repeats)
            profile = None
            if not args.no_profile:
                pool = make_pool([traced], model_dir, tmp_path / "wt", tok, **client) if traced else pools["server_1"]
                profile = profile_server(pool, tmp_path / "trace.jsonl", prompt_ids, n, lengths, wl["temperature"])
                print(f"[bench] profile: {len(profile['calls'])} generate call(s) of sizes "
                      f"{[c['size'] for c in profile['calls']]}, {profile['seconds']:.2f} s", flush=True)
        finally:
            if stop_servers is not None:
                stop_servers()
        step = committed_step(COMMITTED_METRICS)
        measured, measured_error = None, None
        if args.measure_step:
            try:
                measured = measured_step(tmp_path / "step")
            except Exception as exc:  # noqa: BLE001 - the committed step still gives the shares
                measured_error = f"{type(exc).__name__}: {exc}"[-2000:]
                print(f"[bench] the step run failed: {measured_error}", flush=True)
    ratios = {k: v["tokens_per_s"] / tp["in_process"]["tokens_per_s"] for k, v in tp.items() if k != "in_process"}
    sh = shares(step, sync, measured["time_sync_export_s"] if measured else None)
    for name, v in tp.items():
        print(f"[bench] {name}: {v['tokens_per_s']:.0f} tokens/s ({v['seconds']:.2f} s)"
              + (f", {ratios[name]:.2f}x in-process" if name in ratios else ""))
    for kind, v in sh.items():
        print(f"[bench] sync {kind}: {v['sync_s'] * 1e3:.0f} ms = {v['share']:.1%} of a "
              f"{step['time_step_s']:.2f} s step")
    command = "python benchmarks/server_path.py " + " ".join(sys.argv[1:] if argv is None else argv)
    data = {
        "meta": {"command": command.strip(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "host": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": threads,
                 "torch": torch.__version__, "repeats": args.repeats, "sync_repeats": args.sync_repeats,
                 "dry_run": args.dry_run, "client_max_concurrency": concurrency,
                 "client_batching": pools_batching,
                 "load_before": load_before, "load_after": os.getloadavg()[0]},
        "workload": {"prompts": prompts, "n": n, "requests": prompts * n, "max_len": max_len,
                     "temperature": wl["temperature"], "length_cap_mean": sum(lengths) / len(lengths),
                     "prompt_len_mean": sum(map(len, prompt_ids)) / len(prompt_ids), "vocab": len(tok),
                     "model": f"{model_cfg.arch} hidden {model_cfg.hidden_size} x {model_cfg.num_layers} layers, "
                              f"{model_cfg.num_experts} experts ({n_params / 1e6:.2f}M parameters)"},
        "throughput": tp, "ratios": ratios, "same_tokens": same, "profile": profile, "load": load,
        "sync": sync, "step": step, "shares": sh,
        "step_measured": measured, "step_measured_error": measured_error,
        "shares_measured": shares(measured, sync, measured["time_sync_export_s"]) if measured else None,
        "targets": {"server_1_within_15pct": ratios["server_1"] >= 0.85,
                    "sync_under_5pct": {k: v["share"] < 0.05 for k, v in sh.items()}},
        "notes": [],
    }
    if args.out:
        write_report(args.out, data)
        print(f"[bench] wrote {args.out}/server_path.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
