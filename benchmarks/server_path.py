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
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMMITTED_METRICS = ROOT / "results/grpo_default/run_2026-11-21/metrics.jsonl"
TINY_MODEL = dict(hidden_size=32, num_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  intermediate_size=64, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)


# -- setup -------------------------------------------------------------------------------------------
def default_workload() -> dict[str, Any]:
    """The rollout settings and model fields of configs/grpo.yaml, resolved by the config loader."""
    from slime_ext.config import load_config

    cfg = load_config(ROOT / "configs/grpo.yaml").config
    return {"prompts": cfg.rollout.prompts_per_step, "n": cfg.rollout.n_samples_per_prompt,
            "max_len": cfg.rollout.max_response_len, "temperature": cfg.rollout.temperature,
            "threads": cfg.rollout.threads, "vocab_size": cfg.tokenizer.vocab_size,
            "n_tokenizer_texts": cfg.tokenizer.n_training_texts, "template": cfg.data.template,
            "model": cfg.model}


def build_model_dir(out: Path, model_cfg: Any, vocab_size: int, n_texts: int, seed: int = 0) -> list[dict]:
    """Tokenizer (trained on the default task's text, as the tokenizer stage does) + random model, as an HF
    dir in `out`. Returns the synthetic-math rows the prompts come from."""
    from transformers import AutoModelForCausalLM

    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.tasks.synthetic_math import generate_dataset
    from slime_ext.tokenizer import train_tokenizer

    rows = generate_dataset(["L2"], n_texts, seed, "train")
    tok = train_tokenizer([r["prompt"] + "\n" + r["solution"] for r in rows], vocab_size=vocab_size, out_dir=out)
    torch.manual_seed(seed)
    hf = hf_config_from_model_config(model_cfg.model_copy(update={"vocab_size": len(tok)}))
    AutoModelForCausalLM.from_config(hf).eval().save_pretrained(out)
    return rows


def ragged_lengths(count: int, max_len: int, seed: int = 1) -> list[int]:
    """benchmarks/decode.py's rule: request i needs a length drawn from [max_len/8, max_len]."""
    rng = random.Random(seed)
    return [rng.randint(max(1, max_len // 8), max_len) for _ in range(count)]


def make_requests(prompt_ids: list[list[int]], n: int, lengths: list[int], temperature: float, tag: str) -> list:
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    reqs = []
    for i, ids in enumerate(prompt_ids):
        for k in range(n):
            j = i * n + k
            sp = SamplingParams(temperature=temperature, max_new_tokens=lengths[j])
            reqs.append(GenerateRequest(f"{tag}-p{i}-k{k}", ids, sp, seed=1000 * i + k))
    return reqs


def start_servers(actors: list) -> Callable[[], None]:
    """Start the servers at once; returns the function that stops them. Each is started from its own
    thread, which lives until the stop: a server gets SIGTERM when the thread that started it ends
    (PR_SET_PDEATHSIG in EngineServerActor)."""
    release = threading.Event()
    errors: list[BaseException] = []
    started = [threading.Event() for _ in actors]

    def keep(a: Any, done: threading.Event) -> None:
        try:
            a.start()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller
            errors.append(exc)
        done.set()
        release.wait()

    keepers = [threading.Thread(target=keep, args=(a, e), daemon=True) for a, e in zip(actors, started)]
    for t in keepers:
        t.start()
    for e in started:
        e.wait()

    def stop() -> None:
        stoppers = [threading.Thread(target=a.stop) for a in actors]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        release.set()
        for t in keepers:
            t.join()

    if errors:
        stop()
        raise errors[0]
    return stop


def server_actor(index: int, model_dir: Path, log_dir: Path, threads: int, trace_log: Optional[Path] = None,
                 extra_args: tuple[str, ...] = ()) -> Any:
    """An EngineServerActor as the loop makes them; with `trace_log`, its server is `serve_traced`; `extra_args`
    are appended to the server's command line (e.g. `--no-continuous-batching`)."""
    import slime_ext.engine.engine_server as es
    from slime_ext.config.sections import SGLangConfig

    class Custom(es.EngineServerActor):
        def start(self, weight_version: str = es.INITIAL_VERSION) -> str:
            original = es.server_command

            def command(*a: Any, **k: Any) -> tuple[list[str], dict[str, str]]:
                argv, env = original(*a, **k)
                if trace_log is not None:
                    at = argv.index("-m")
                    assert argv[at + 1] == es.STANDIN, argv
                    argv = [argv[0], str(Path(__file__).resolve()), TRACE_FLAG, str(trace_log), *argv[at + 2:]]
                return [*argv, *extra_args], env

            with _START_LOCK:  # the module function is swapped only while this start builds its command
                es.server_command = command
                try:
                    return super().start(weight_version)
                finally:
                    es.server_command = original

    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = SGLangConfig(num_engines=1, startup_timeout_s=180, request_timeout_s=600)
    cls = es.EngineServerActor if trace_log is None and not extra_args else Custom
    return cls(index, cfg, str(model_dir), threads=threads, log_dir=str(log_dir), use_sglang=False)


def make_pool(actors: list, model_dir: Path, weights_dir: Path, tokenizer: Any, **client: Any):
    """A pool over `actors` with the client settings `slime_ext.orchestration.engines` gives the loop."""
    from slime_ext.engine.server_pool import ServerEnginePool

    kwargs = {"eos_token_id": tokenizer.eos_token_id, "tokenizer_path": str(model_dir),
              "vocab_size": len(tokenizer), "native_partner": False, **client}
    return ServerEnginePool(actors, [a.url for a in actors], actors[0].cfg, str(weights_dir), client_kwargs=kwargs)


# -- profile: where the server path's time goes ------------------------------------------------------
TRACE_FLAG = "--serve-traced"
_START_LOCK = threading.Lock()


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


# -- measurements ------------------------------------------------------------------------------------
def latency_under_load(pool: Any, prompt_ids: list[list[int]], n: int, count: int, max_len: int,
                       temperature: float) -> dict[str, Any]:
    """`count` requests (prompts cycled, `n` samples each, ragged caps) sent at once through the pool's one
    client (its max_concurrency should be >= count: all in flight at once); each request's completion time from
    the start (client side), and their distribution."""
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
        if path == "/generate":
            done.append(time.perf_counter() - t0)
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


def timed(fn: Any, requests: list) -> tuple[float, list]:
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


def load_named(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return list(weights.items())


def sync_times(pool: Any, named: list, repeats: int) -> dict[str, dict]:
    """sync_weights to the pool's server(s) with every method, the weights pushed from this process as one
    trainer rank would (`LocalWeightSource`); median of `repeats` after one warm-up (the distributed method's
    group is built in the warm-up, once per run as in the loop). push = the senders' buckets, commit = the
    driver's control messages (the disk index and load, or the version)."""
    from slime_ext.engine.weight_sync import LocalWeightSource

    out: dict[str, dict] = {}
    version = 100
    base_cfg = pool.cfg
    source = LocalWeightSource(named)
    for kind in ("disk", "tensor", "distributed"):
        pool.cfg = base_cfg.model_copy(update={"weight_sync": kind})
        t0 = time.perf_counter()
        pool.sync_weights(source, version)
        first = time.perf_counter() - t0
        version += 1
        rows = []
        for _ in range(repeats):
            rows.append(pool.sync_weights(source, version))
            version += 1
        commit = [r["time/sync_commit"] for r in rows]
        push = [r["time/sync_push"] for r in rows]
        total = [s + p for s, p in zip(commit, push)]
        out[kind] = {"commit_s": statistics.median(commit), "push_s": statistics.median(push),
                     "push_plus_commit_s": statistics.median(total), "first_sync_s": first,
                     "all_push_plus_commit_s": total}
        print(f"[bench] sync {kind}: push {out[kind]['push_s'] * 1e3:.1f} ms + commit "
              f"{out[kind]['commit_s'] * 1e3:.1f} ms (median of {repeats}; first {first * 1e3:.0f} ms)", flush=True)
    pool.cfg = base_cfg
    return out


def committed_step(path: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    med = lambda k: statistics.median(r[k] for r in rows if k in r)  # noqa: E731
    return {"source": f"committed metrics of the default job: {path.relative_to(ROOT)} (median of {len(rows)} "
                      f"RL steps, trained model, natural EOS)",
            "time_step_s": med("time/step"), "time_rollout_s": med("time/rollout"), "time_train_s": med("time/train"),
            "time_sync_s": med("time/sync"), "time_sync_export_s": None,
            "response_len_mean": med("response_len/mean"), "steps": len(rows)}


def measured_step(workdir: Path, steps: int = 2) -> dict[str, Any]:
    """A fresh run of the default job (SFT 2 steps, `steps` RL steps, no evaluation); the last RL step's row."""
    out_dir, cache = workdir / "runs", workdir / "cache"
    argv = [sys.executable, "-m", "slime_ext.orchestration.driver", str(ROOT / "configs/grpo.yaml"), "sft.steps=2",
            f"train.steps={steps}", "run.stages=[data,tokenizer,sft,rl]", f"run.output_dir={out_dir}",
            f"run.cache_dir={cache}"]
    print("[bench] measuring the RL step:", " ".join(argv[1:]), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=str(ROOT), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the driver run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = sorted(out_dir.rglob("metrics.jsonl"))
    if not metrics:
        raise RuntimeError(f"no metrics.jsonl under {out_dir}")
    rows = [json.loads(line) for line in metrics[-1].read_text().splitlines() if line.strip()]
    row = rows[-1]
    return {"source": f"measured: `python -m slime_ext.orchestration.driver configs/grpo.yaml sft.steps=2 "
                      f"train.steps={steps} run.stages=[data,tokenizer,sft,rl] ...`, RL step {row['step']} "
                      f"(untrained model: responses run to the length limit)",
            "time_step_s": row["time/step"], "time_rollout_s": row["time/rollout"], "time_train_s": row["time/train"],
            "time_sync_s": row["time/sync"], "time_sync_export_s": row.get("time/sync_export"),
            "response_len_mean": row["response_len/mean"], "steps": len(rows),
            "all_rows": [{k: r[k] for k in ("step", "time/step", "time/rollout", "time/train", "time/sync",
                                            "time/sync_export") if k in r} for r in rows],
            "driver_wall_s": time.perf_counter() - t0}


def shares(step: dict[str, Any], sync: dict[str, dict], export: Optional[float] = None) -> dict[str, dict]:
    """Per method: the server path's sync in the loop (export + snapshot + push) and its share of a step whose
    embedded sync is replaced by it; plus the embedded engine's own share. `export`: the trainer's export
    time (measured); None: bounded by the embedded run's whole time/sync (export + Ray copy)."""
    export_used = export if export is not None else step["time_sync_s"]
    base = step["time_step_s"] - step["time_sync_s"]  # the step without its sync
    out = {"embedded": {"sync_s": step["time_sync_s"], "share": step["time_sync_s"] / step["time_step_s"]}}
    for kind, v in sync.items():
        total = export_used + v["push_plus_commit_s"]
        out[kind] = {"sync_s": total, "share": total / (base + total), "export_s": export_used,
                     "export_is_bound": export is None}
    return out


# -- report ------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def write_report(out: Path, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "server_path.json").write_text(json.dumps(data, indent=2) + "\n")
    m, w, tp, r = data["meta"], data["workload"], data["throughput"], data["ratios"]
    lines = ["# server path benchmark (engine servers vs the in-process engine)", "",
             f"- command: `{m['command']}`",
             f"- date: {m['date']}; machine: {m['cpu']}, {m['cpu_count']} cores ({m['host']}); torch {m['torch']}; "
             f"one torch thread in the engine and in each server; load average (1 min) {m['load_before']:.1f} at the "
             f"start, {m['load_after']:.1f} at the end",
             f"- workload: {w['prompts']} prompts x {w['n']} samples = {w['requests']} requests, mean prompt "
             f"{w['prompt_len_mean']:.0f} tokens, max_response_len {w['max_len']} (ragged caps, mean "
             f"{w['length_cap_mean']:.0f}, or EOS), temperature {w['temperature']}, model {w['model']}, "
             f"vocab {w['vocab']}; {m['repeats']} interleaved repeats, best kept, prefix caches flushed before each; "
             f"client max_concurrency {m['client_max_concurrency']} (server_1_concN: N)",
             "", "## Throughput", "",
             "| path | s (best) | generated tokens | tokens/s | / in-process | same tokens as in-process |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, v in tp.items():
        ratio = "1.00" if name == "in_process" else f"{r[name]:.2f}"
        same = "-" if name == "in_process" else f"{data['same_tokens'][name]:.0%}"
        lines.append(f"| {name} | {v['seconds']:.2f} | {v['generated_tokens']} | {v['tokens_per_s']:.0f} | "
                     f"{ratio} | {same} |")
    rate = {k: [t / x for t, x in zip(v["all_tokens"], v["all_seconds"])] for k, v in tp.items()}
    lines += ["", "Per repeat, against the same repeat's in-process run: " + "; ".join(
        f"{k} " + ", ".join(f"{a / b:.2f}" for a, b in zip(rate[k], rate["in_process"])) for k in tp if k != "in_process")
        + ".", "", f"Target (b)/(a) >= 0.85: {'met' if data['targets']['server_1_within_15pct'] else 'NOT met'} "
                   f"({r['server_1']:.2f}, best against best)."]
    pr = data.get("profile")
    if pr:
        calls = pr["calls"]
        lines += ["", "### Where the server path's time goes (one traced run, 1 server)", "",
                  f"The same workload through a server whose batcher logs each `engine.generate` call: "
                  f"{pr['seconds']:.2f} s, {pr['tokens_per_s']:.0f} tokens/s. Offsets from the client's "
                  f"`generate` call:", "",
                  f"- the client sent its {w['requests']} HTTP requests at "
                  f"+{pr['client_sends_s'][0]:.2f} .. +{pr['client_sends_s'][1]:.2f} s; the server's batcher got "
                  f"them at +{pr['server_arrivals_s'][0]:.2f} .. +{pr['server_arrivals_s'][1]:.2f} s (longest "
                  f"pause between two arrivals {pr['arrival_gap_max_s'] * 1e3:.0f} ms);",
                  f"- {len(calls)} generate call(s): " + "; ".join(
                      f"{c['size']} requests at +{c['start_s']:.2f} s for {c['seconds']:.2f} s" for c in calls[:8])
                  + (f"; ... ({len(calls) - 8} more)" if len(calls) > 8 else "") + ";",
                  f"- after the last call: {pr['tail_s']:.2f} s until the client had every response "
                  f"(responses serialised, sent and parsed).",
                  f"- in-process, one call of all {w['requests']} took {tp['in_process']['seconds']:.2f} s "
                  f"(best run above)."]
    load = data.get("load")
    if load:
        lines += ["", "## Latency under load", "",
                  f"{next(iter(load.values()))['requests']} requests sent at once through one client to one server "
                  f"(client max_concurrency {next(iter(load.values()))['client_max_concurrency']}); completion time "
                  f"of each request from the start, client side:", "",
                  "| server | s (all) | generated tokens | p10 s | median s | p90 s | max s | median / max |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, v in load.items():
            lines.append(f"| {name} | {v['seconds']:.2f} | {v['generated_tokens']} | {v['p10_s']:.2f} | "
                         f"{v['p50_s']:.2f} | {v['p90_s']:.2f} | {v['max_s']:.2f} | {v['median_over_max']:.2f} |")
    if data.get("notes"):
        lines += [""] + [f"- {n}" for n in data["notes"]]
    st, ms = data["step"], data.get("step_measured")
    export = ms["time_sync_export_s"] if ms else None
    lines += ["", "## Weight sync (1 server) and its share of an RL step", "",
              f"Step: {st['source']}: time/step {st['time_step_s']:.2f} s (rollout {st['time_rollout_s']:.2f} s, "
              f"train {st['time_train_s']:.2f} s, embedded sync {st['time_sync_s'] * 1e3:.0f} ms). A server path's "
              f"sync in the loop is export + push + commit; the export (trainer side, the same for every engine) is "
              + (f"{export * 1e3:.0f} ms, the measured run's time/sync_export." if export is not None else
                 "bounded by the embedded run's whole time/sync (export + the Ray copy): those metrics predate "
                 "time/sync_export."), "",
              "| method | commit ms | push ms (median) | sync in the loop ms | share of the step |",
              "| --- | ---: | ---: | ---: | ---: |"]
    sh = data["shares"]
    lines.append(f"| embedded (export + in-process copy via Ray) | - | - | {sh['embedded']['sync_s'] * 1e3:.0f} | "
                 f"{sh['embedded']['share']:.1%} |")
    for kind, v in data["sync"].items():
        lines.append(f"| {kind} | {v['commit_s'] * 1e3:.1f} | {v['push_s'] * 1e3:.1f} | "
                     f"{sh[kind]['sync_s'] * 1e3:.0f} | {sh[kind]['share']:.1%} |")
    lines += ["", "Target sync < 5% of the step: " + ", ".join(
        f"{k} {'met' if v else 'NOT met'}" for k, v in data["targets"]["sync_under_5pct"].items()) + "."]
    if ms:
        lines += ["", f"Measured here as well, {ms['source']}: time/step {ms['time_step_s']:.2f} s (rollout "
                      f"{ms['time_rollout_s']:.2f} s, train {ms['time_train_s']:.2f} s, mean response "
                      f"{ms['response_len_mean']:.0f} tokens), embedded time/sync {ms['time_sync_s'] * 1e3:.0f} ms "
                      + (f"(export {ms['time_sync_export_s'] * 1e3:.0f} ms)" if ms.get("time_sync_export_s") is not None else
                     "(the export happens inside the ranks' push since the sync from the ranks)")
                  + ". Shares of that step: "
                  + ", ".join(f"{k} {v['share']:.1%}" for k, v in data["shares_measured"].items()) + "."]
    elif data.get("step_measured_error"):
        lines += ["", f"The measured step run failed: {data['step_measured_error']}"]
    (out / "server_path.md").write_text("\n".join(lines) + "\n")


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
            if args.compare_concurrency:
                capped = {**client, "max_concurrency": args.compare_concurrency}
                pools[f"server_1_conc{args.compare_concurrency}"] = make_pool(actors[:1], model_dir, tmp_path / "wc",
                                                                                tok, **capped)
            concurrency = pools["server_1"].clients[0].max_concurrency
            tp, same = throughput(engine, pools, prompt_ids, n, lengths, wl["temperature"], args.repeats)
            load = {}
            for name, pool_actors in (("server_1", actors[:1]), ("server_1_static", [static] if static else None)):
                if args.load_requests and pool_actors:  # a pool with every request in flight at once
                    wide = make_pool(pool_actors, model_dir, tmp_path / f"wl_{name}", tok,
                                     **{**client, "max_concurrency": max(args.load_requests, 1)})
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
