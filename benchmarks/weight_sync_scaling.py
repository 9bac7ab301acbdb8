"""Weight sync against model size: seconds, bytes through the driver and every process's peak memory.

For Qwen3-MoE shapes from ~4M to ~560M parameters (`SIZES`) and trainer layouts TP/EP 1 and 2 (`LAYOUTS`),
a real trainer (Ray actors running `megatron_glue`, gloo) and one real engine server (the project's
SGLang-protocol server, bf16 weights) are started from a random HF checkpoint; then, for every path
(disk, tensor, distributed, delta = tensor with `sglang.weight_sync_delta`), one warm-up sync and
`--repeats` measured syncs, each after a real optimizer step (GRPO, lr 3e-5, on six synthetic samples), so
every sync moves freshly trained weights. Per sync:
- seconds of `ServerEnginePool.sync_weights` (the loop's call);
- driver bytes: weight-tensor bytes that entered the driver (counted in every object `ray.get` returned to
  it during the sync) plus those it sent itself (the former path's push from the driver);
- the peak RSS growth of each process above its level at the sync's start (driver, trainer ranks, engine
  server), sampled every 5 ms from the driver, next to the process's shard and the bucket size;
- bytes sent and the changed share (delta).

`--src DIR` imports the project from another checkout: run once at the commit before the change (the
driver gathered every weight and pushed it; its pool API is detected) for the before column, then at this
one; `--compare A.json B.json` writes the side-by-side table and the log-log plot with fitted slopes and
the Qwen3-30B-A3B extrapolation.

    python benchmarks/weight_sync_scaling.py --out results/benchmarks/weight_sync   # every size and path
    python benchmarks/weight_sync_scaling.py --quick --out /tmp/ws                    # smallest size, ~1 min
    python benchmarks/weight_sync_scaling.py --src /tmp/before --label before --out ...
    python benchmarks/weight_sync_scaling.py --compare before.json after.json --out ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]

SIZES = {  # name: (hidden, layers, experts, moe_ffn, vocab); 2 KV heads of 64, 2 experts per token, untied
    "4M": (128, 2, 8, 128, 12288),
    "30M": (256, 4, 16, 256, 16384),
    "120M": (512, 6, 16, 384, 32768),
    "560M": (1024, 8, 32, 512, 65536),
}
LAYOUTS = {"tp1ep1": dict(tp=1, ep=1), "tp2ep2": dict(tp=2, ep=2, etp=1, sequence_parallel=True)}
# colocated: tensor with both sides' sleep; distributed-one-sender: distributed with every expert gathered to the
# stage's one sender (sglang.expert_senders false), against distributed's sender per EP rank
# lora: a LoRA trainer (rank 8 on q/k/v/o, train.lora.sync: adapter) sending the adapter alone
PATHS = ("disk", "tensor", "distributed", "delta", "colocated", "distributed-one-sender", "lora")
LORA_RANK = 8
QWEN3_30B_PARAMS = 30.5e9
QWEN3_30B_EXPERT_PARAMS = 48 * 128 * 3 * 2048 * 768  # layers x experts x (gate, up, down) x hidden x expert FFN
_CASES = itertools.count(1)


# -- models -------------------------------------------------------------------------------------
def hf_config(size: str) -> Any:
    from transformers import Qwen3MoeConfig

    hidden, layers, experts, moe_ffn, vocab = SIZES[size]
    return Qwen3MoeConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=max(2, hidden // 64), num_key_value_heads=2, head_dim=64,
                          intermediate_size=moe_ffn * 2, moe_intermediate_size=moe_ffn, num_experts=experts,
                          num_experts_per_tok=2, max_position_embeddings=512, tie_word_embeddings=False,
                          norm_topk_prob=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def write_checkpoint(size: str, directory: Path) -> int:
    """A random bf16 HF checkpoint of `size` (written tensor by tensor, no model object); returns params."""
    import torch

    from megatron_glue.checkpoint_io import save_hf_checkpoint
    from megatron_glue.weight_names import _hf_shapes, model_dims

    cfg = hf_config(size)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in _hf_shapes(model_dims(cfg)).items():
        state[name] = (torch.ones(shape) + 0.05 * torch.randn(shape, generator=gen) if name.endswith("norm.weight")
                       else 0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    save_hf_checkpoint(directory, cfg, state, shard_size_mb=1024)
    from slime_ext.tokenizer import train_tokenizer  # the server needs one; nothing is generated here

    train_tokenizer(["the weights go from the trainer to the engine 1 2 3"] * 40, vocab_size=300, out_dir=directory)
    return sum(t.numel() for t in state.values())


def samples(vocab: int, n: int = 6) -> list:
    import random

    from slime_ext.data import Sample

    rng = random.Random(7)
    out = []
    for i in range(n):
        r = rng.randint(8, 16)
        out.append(Sample(f"s{i}", [rng.randrange(3, vocab) for _ in range(8)], [rng.randrange(3, vocab) for _ in range(r)],
                          logprobs=[-3.0] * r, advantage=(-1.0) ** i, weight=1.0))
    return out


# -- measuring ----------------------------------------------------------------------------------
class Sampler:
    """Peak RSS growth of several processes (by pid) while the body runs."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.005):
        import psutil

        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.interval_s = interval_s
        self.start: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()

    def _read(self) -> None:
        for k, p in self.procs.items():
            try:
                self.peak[k] = max(self.peak.get(k, 0), p.memory_info().rss)
            except Exception:  # noqa: BLE001 - a process that just exited
                pass

    def __enter__(self) -> "Sampler":
        self.start = {k: p.memory_info().rss for k, p in self.procs.items()}
        self.peak = dict(self.start)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def growth(self) -> dict[str, int]:
        return {k: self.peak[k] - self.start[k] for k in self.procs}


def tensor_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _trim_heap(_self: Any = None) -> None:
    """glibc `malloc_trim(0)` in this process (a no-op elsewhere). Not `weight_sync.return_freed_memory`: the
    "before" column imports a checkout (`--src`) that lacks it, and both columns must be measured alike."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def trim_heaps(workers: Any) -> None:
    """Every rank's and the driver's heap trimmed before a sync is measured: the start level is then live
    memory, not what the train step left in the heap, for the code before and after alike (a trimmed heap
    cannot hide the sync's own transients under memory the heap kept from the step)."""
    import ray

    _trim_heap()
    ray.get([w.__ray_call__.remote(_trim_heap) for w in workers])


class DriverBytes:
    """Counts weight bytes in every object `ray.get` hands the driver while active."""

    def __init__(self) -> None:
        self.bytes = 0

    def __enter__(self) -> "DriverBytes":
        import ray

        self._real = ray.get

        def counting_get(refs: Any, *a: Any, **k: Any) -> Any:
            out = self._real(refs, *a, **k)
            self.bytes += tensor_bytes(out)
            return out

        ray.get = counting_get
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        ray.get = self._real


# -- one size x layout --------------------------------------------------------------------------
def run_case(size: str, layout: str, paths: tuple[str, ...], repeats: int, bucket_mb: float, work: Path,
             log: Any) -> list[dict]:
    import ray

    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.trainer import TrainerSettings
    from slime_ext.config.sections import SGLangConfig
    from slime_ext.engine import weight_sync
    from slime_ext.engine.engine_server import EngineServerActor
    from slime_ext.engine.server_pool import ServerEnginePool
    from slime_ext.orchestration.placement import ActorGroup, Placement
    from slime_ext.orchestration.train_group import TrainGroup

    new_api = hasattr(weight_sync, "ServerTarget")
    ckpt = work / f"ckpt_{size}"
    if not (ckpt / "config.json").exists():
        params = write_checkpoint(size, ckpt)
    else:
        params = sum(math.prod(s) for s in _shapes(size).values())
    sizes = ParallelSizes(**LAYOUTS[layout])
    world = 2 if layout != "tp1ep1" else 1
    group_kwargs = {"bucket_mb": bucket_mb} if new_api else {}
    group = TrainGroup(ActorGroup("train", world, {"CPU": 0.01}, [[r] for r in range(world)], "bench"),
                       Placement({"CPU": 0.01}, world, world, "PACK"), threads=1, **group_kwargs)
    actor = None
    rows: list[dict] = []
    try:
        group.setup(hf_config(size), TrainerSettings(lr=3e-5, micro_batch_size=6, seed=0), sizes, 0, ckpt)
        cfg = SGLangConfig(num_engines=1, startup_timeout_s=600, request_timeout_s=600)
        actor = EngineServerActor(0, cfg, str(ckpt), log_dir=str(work), dtype="bfloat16")
        url = actor.start()
        pool_kwargs = {"engine_dtype": "bfloat16", "base_dir": str(ckpt)} if new_api else {}
        pool = ServerEnginePool([actor], [url], cfg, str(work / f"weights_{size}_{layout}"), **pool_kwargs)
        rank_pids = ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in group.workers])
        pids = {"driver": os.getpid(), "engine": actor.pid(), **{f"rank{i}": p for i, p in enumerate(rank_pids)}}
        shard = {f"rank{i}": b for i, b in enumerate(ray.get([w.__ray_call__.remote(
            lambda self: sum(t.numel() * t.element_size() for t in self.trainer.local_state_dict().values()))
            for w in group.workers]))}
        batch = samples(hf_config(size).vocab_size)
        version = 0
        base_group, base_pool = group, pool
        for path in paths:
            group, pool = base_group, base_pool
            if path == "lora":
                if not hasattr(pool, "lora_name"):
                    continue
                group, pool = lora_case(size, world, sizes, ckpt, group_kwargs, cfg, actor, url, pool_kwargs, work)
            if path == "delta" and not new_api:
                continue
            if path == "colocated" and not hasattr(pool, "sleep"):
                continue
            kind = {"delta": "tensor", "colocated": "tensor", "distributed-one-sender": "distributed"}.get(path, path)
            if path == "distributed-one-sender" and "expert_senders" not in type(cfg).model_fields:
                continue
            extra = {"expert_senders": path != "distributed-one-sender"} if "expert_senders" in type(cfg).model_fields \
                else {}
            pool.cfg = cfg.model_copy(update={"weight_sync": "tensor" if path == "lora" else kind, **extra,
                                              **({"weight_sync_delta": path == "delta"} if new_api else {})})
            if not new_api:
                pool.weight_sync = weight_sync.make_weight_sync(kind, "127.0.0.1")
                if kind == "distributed":  # group names must be new in this process for every case
                    pool.weight_sync.generation = next(_CASES) * 100
            colocated = path == "colocated"
            for r in range(repeats + 1):  # the first is the warm-up (group setup, first dense delta)
                slept: dict = {}
                if colocated:  # the loop's order: engines release, trainer back, train, wake weights, sync, wake KV
                    slept = pool.sleep()
                if hasattr(pool, "sleep"):
                    group.call("onload")  # after a colocated path the trainer is away (a no-op otherwise)
                group.first("train_step", batch, "grpo")
                version += 1
                trim_heaps(group.workers)
                driver_rss = weight_sync.rss_bytes()
                with Sampler(pids) as mem, DriverBytes() as into_driver:
                    t0 = time.perf_counter()
                    if colocated:
                        pool.wake_weights()
                        out = pool.sync_weights(group, version)
                        pool.wake_kv_cache()
                        offloaded = sum(group.call("offload"))  # the trainer leaves the device to the next rollout
                    elif new_api:
                        out = pool.sync_weights(group, version)
                        sent_by_driver = 0
                    else:
                        named = group.export_hf()
                        sent_by_driver = tensor_bytes(named)
                        out = pool.sync_weights(named, version)
                        del named
                    seconds = time.perf_counter() - t0
                row = {"size": size, "params": params, "layout": layout, "path": path, "repeat": r,
                       "warmup": r == 0, "seconds": seconds, "driver_bytes": into_driver.bytes + sent_by_driver,
                       "peak_growth_bytes": mem.growth(), "shard_bytes": shard, "bucket_bytes": int(bucket_mb * 2**20),
                       "model_bytes_bf16": 2 * params,
                       "bytes_sent": out.get("sync/bytes_sent"), "changed_share": out.get("sync/changed_share"),
                       "driver_rss_growth_bytes": max(0, weight_sync.rss_bytes() - driver_rss),
                       "metrics": {k: v for k, v in out.items() if isinstance(v, (int, float))}}
                if colocated:
                    row["engine_released_bytes"] = slept.get("engine/released_bytes")
                    row["trainer_offloaded_bytes"] = offloaded
                rows.append(row)
                log(f"[ws] {size:>5} {layout} {path:<11} {'warm-up' if r == 0 else f'rep {r}':<7} "
                    f"{seconds:7.3f} s  driver {row['driver_bytes'] / 2**20:8.1f} MiB  peak+ "
                    + " ".join(f"{k} {v / 2**20:.0f}" for k, v in row["peak_growth_bytes"].items()) + " MiB"
                    + (f"  changed {row['changed_share']:.4f}" if row["changed_share"] is not None else "")
                    + (f"  sender gathers {out['memory/sync_sender_growth_gather_mib']:.0f} sends "
                       f"{out['memory/sync_sender_growth_send_mib']:.0f} MiB"
                       if "memory/sync_sender_growth_gather_mib" in out else ""))
            if path == "lora":
                group.shutdown()
    finally:
        if actor is not None:
            actor.stop()
        base_group.shutdown()
    return rows


def lora_case(size: str, world: int, sizes: Any, ckpt: Path, group_kwargs: dict, cfg: Any, actor: Any, url: str,
              pool_kwargs: dict, work: Path) -> tuple[Any, Any]:
    """A trainer with rank-`LORA_RANK` adapters that sends them alone, and a pool naming the adapter (the same
    engine server, which keeps the base it holds)."""
    from megatron_glue.lora import LoRASpec
    from megatron_glue.trainer import TrainerSettings
    from slime_ext.engine.lora_sync import LORA_NAME
    from slime_ext.engine.server_pool import ServerEnginePool
    from slime_ext.orchestration.placement import ActorGroup, Placement
    from slime_ext.orchestration.train_group import TrainGroup

    group = TrainGroup(ActorGroup("train", world, {"CPU": 0.01}, [[r] for r in range(world)], "bench"),
                       Placement({"CPU": 0.01}, world, world, "PACK"), threads=1, **group_kwargs)
    lora = LoRASpec(rank=LORA_RANK, alpha=2.0 * LORA_RANK, target_modules=("linear_qkv", "linear_proj"), sync="adapter")
    group.setup(hf_config(size), TrainerSettings(lr=3e-5, micro_batch_size=6, seed=0, lora=lora), sizes, 0, ckpt)
    pool = ServerEnginePool([actor], [url], cfg.model_copy(update={"weight_sync": "tensor"}),
                            str(work / f"weights_{size}_lora"), lora_name=LORA_NAME, **pool_kwargs)
    return group, pool


def _shapes(size: str) -> dict:
    from megatron_glue.weight_names import _hf_shapes, model_dims

    return _hf_shapes(model_dims(hf_config(size)))


def run(args: argparse.Namespace) -> Path:
    import ray

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = ["4M"] if args.quick else args.sizes
    layouts = ["tp1ep1"] if args.quick else args.layouts
    repeats = 1 if args.quick else args.repeats
    work = Path(args.work or tempfile.mkdtemp(prefix="weight_sync_"))
    log_path = out / f"weight_sync_{args.label}.log"
    log_file = log_path.open("a")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    # address="local": a fresh instance, never a cluster another process left behind (a test run's)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    import slime_ext

    rows: list[dict] = []
    errors: list[dict] = []
    result = {"label": args.label, "source": str(args.src or ROOT), "commit": _commit(Path(args.src or ROOT)),
              "imported_from": str(Path(slime_ext.__file__).parent),
              "machine": _machine(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([sys.executable, *sys.argv]), "bucket_mb": args.bucket_mb, "rows": rows,
              "errors": errors}
    path = out / f"weight_sync_{args.label}.json"
    try:
        for size in sizes:
            for layout in layouts:
                try:
                    rows += run_case(size, layout, tuple(args.paths), repeats, args.bucket_mb, work, log)
                except Exception as exc:  # noqa: BLE001 - e.g. the former path running out of memory
                    errors.append({"size": size, "layout": layout, "error": f"{type(exc).__name__}: {exc}"[:3000]})
                    log(f"[ws] {size} {layout} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                path.write_text(json.dumps(result, indent=1) + "\n")  # kept after every case
    finally:
        ray.shutdown()
    path.write_text(json.dumps(result, indent=1) + "\n")
    if args.quick:
        quick = {"paths": {}}
        for p in PATHS:
            measured = [r for r in rows if r["path"] == p and not r["warmup"]]
            if measured:
                last = measured[-1]
                quick["paths"][p] = {"seconds": last["seconds"], "driver_bytes": last["driver_bytes"],
                                     "peak_bytes": last["peak_growth_bytes"], "bytes_sent": last["bytes_sent"],
                                     "params": last["params"],
                                     # the driver's resident growth over this path's syncs (not a whole job)
                                     "driver_rss_growth_bytes": max(r.get("driver_rss_growth_bytes", 0)
                                                                    for r in measured),
                                     **({"engine_released_bytes": last["engine_released_bytes"],
                                         "trainer_offloaded_bytes": last["trainer_offloaded_bytes"]}
                                        if p == "colocated" else {})}
        (out / "weight_sync_quick.json").write_text(json.dumps(quick, indent=1) + "\n")
    log(f"[ws] wrote {path} (slime_ext imported from {result['imported_from']})")
    log_file.close()
    return path


# -- the side-by-side table, the plot and the extrapolation ----------------------------------------
def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summarize(result: dict) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    groups: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        if not r["warmup"]:
            groups.setdefault((r["layout"], r["path"], r["size"]), []).append(r)
    for key, rows in groups.items():
        peaks = {p: max(r["peak_growth_bytes"][p] for r in rows) for p in rows[0]["peak_growth_bytes"]}
        out[key] = {"seconds": _median(rows, "seconds"), "params": rows[0]["params"],
                    "driver_bytes": max(r["driver_bytes"] for r in rows), "peaks": peaks,
                    "bucket_bytes": rows[0]["bucket_bytes"], "shard_bytes": rows[0]["shard_bytes"],
                    "changed_share": rows[-1].get("changed_share"), "bytes_sent": rows[-1].get("bytes_sent"),
                    "n": len(rows), "all_seconds": [r["seconds"] for r in rows]}
    return out


def slope(points: list[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of log10(seconds) on log10(params)."""
    if len(points) < 2:
        return None
    xs = [math.log10(p) for p, _ in points]
    ys = [math.log10(s) for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def compare(before_path: Path, after_path: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    b, a = summarize(before), summarize(after)
    layouts = sorted({k[0] for k in a})
    lines = [f"# Weight sync against model size: before ({before['commit']}) and after ({after['commit']})", "",
             f"Machine: {after['machine']}; before run {before['date']}, after run {after['date']} (same machine "
             f"and day unless these differ). Engine: one CPU engine server in bf16; trainer fp32 on gloo; "
             f"bucket {after['bucket_mb']:.0f} MiB. Seconds: median of {next(iter(a.values()))['n']} syncs, each after "
             f"one optimizer step. Peak: the largest RSS growth above the sync's start level, per process.", ""]
    slopes = {}
    fig, axes = plt.subplots(1, len(layouts), figsize=(6.5 * len(layouts), 4.6), squeeze=False)
    for ax, layout in zip(axes[0], layouts):
        lines += [f"## {layout}", "", "| path | size | params | before s | after s | ratio | driver MiB before | "
                  "driver MiB after | peak growth MiB after (driver / ranks / engine) | changed share |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for path in PATHS:
            pts_a = sorted((v["params"], v["seconds"]) for k, v in a.items() if k[:2] == (layout, path))
            pts_b = sorted((v["params"], v["seconds"]) for k, v in b.items() if k[:2] == (layout, path))
            if pts_a:
                s = slope(pts_a)
                slopes[(layout, path, "after")] = s
                ax.loglog(*zip(*pts_a), "o-", label=f"{path} after (slope {s:.2f})" if s else f"{path} after")
            if pts_b:
                s = slope(pts_b)
                slopes[(layout, path, "before")] = s
                ax.loglog(*zip(*pts_b), "x--", label=f"{path} before (slope {s:.2f})" if s else f"{path} before")
            failed = {(e["size"], e["layout"]) for e in before.get("errors", [])}
            for size in SIZES:
                va, vb = a.get((layout, path, size)), b.get((layout, path, size))
                if va is None:
                    continue
                peaks = va["peaks"]
                ranks = "/".join(f"{peaks[k] / 2**20:.0f}" for k in sorted(peaks) if k.startswith("rank"))
                missing = "failed (see errors)" if (size, layout) in failed else "-"
                lines.append(
                    f"| {path} | {size} | {va['params'] / 1e6:.1f}M | {vb['seconds']:.3f} | {va['seconds']:.3f} | "
                    f"{vb['seconds'] / va['seconds']:.2f}x | {vb['driver_bytes'] / 2**20:.1f} | " if vb else
                    f"| {path} | {size} | {va['params'] / 1e6:.1f}M | {missing} | {va['seconds']:.3f} | - | - | ")
                lines[-1] += (f"{va['driver_bytes'] / 2**20:.1f} | {peaks['driver'] / 2**20:.0f} / {ranks} / "
                              f"{peaks['engine'] / 2**20:.0f} | "
                              + (f"{va['changed_share']:.4f}" if va["changed_share"] is not None else "-") + " |")
        lines.append("")
        ax.set_xlabel("parameters")
        ax.set_ylabel("sync seconds")
        ax.set_title(f"weight sync, {layout}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png = out / "weight_sync_scaling.png"
    fig.savefig(png, dpi=120)
    lines += ["## Fitted slopes (log10 seconds on log10 parameters)", "",
              "| layout | path | before | after |", "| --- | --- | ---: | ---: |"]
    for layout in layouts:
        for path in PATHS:
            sb, sa = slopes.get((layout, path, "before")), slopes.get((layout, path, "after"))
            if sa is not None or sb is not None:
                lines.append(f"| {layout} | {path} | {sb:.2f} | {sa:.2f} |" if sb is not None and sa is not None
                             else f"| {layout} | {path} | - | {sa:.2f} |")
    if before.get("errors"):
        lines += ["", "## Runs that failed before the change", ""]
        lines += [f"- {e['size']} {e['layout']}: {e['error'].splitlines()[0][:400]}" for e in before["errors"]]
    lines += ["", *extrapolation(a), ""]
    md = out / "weight_sync_scaling.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def extrapolation(a: dict[tuple, dict]) -> list[str]:
    """Qwen3-30B-A3B on the launcher's 4 nodes x 8 H100 (TP 4, EP 8, PP 1 -> one sender; 4 engines of TP 8):
    bytes over the assumed links, not the CPU times (the CPU run checks the slope and the memory bounds)."""
    bf16 = 2 * QWEN3_30B_PARAMS
    nvlink, ib = 150e9, 45e9  # B/s: effective NVLink all-gather per GPU; one 400 Gb/s NIC per sender
    gather = bf16 / nvlink  # TP/EP gathers inside the sender's node (each byte crosses NVLink about once)
    full = gather + bf16 / ib  # a broadcast tree: the sender's NIC carries every byte once (NCCL ring/tree)
    delta_share = None
    for (layout, path, size), v in sorted(a.items(), key=lambda kv: -kv[1]["params"]):
        if path == "delta" and v["changed_share"] is not None:
            delta_share = v["changed_share"]
            break
    rows = ["## Extrapolation to Qwen3-30B-A3B (4 nodes x 8 H100, the launcher's layout)", "",
            f"Assumed: {QWEN3_30B_PARAMS / 1e9:.1f}B parameters in bf16 = {bf16 / 1e9:.0f} GB per sync; one sender "
            f"(PP 1); NVLink all-gather at {nvlink / 1e9:.0f} GB/s effective; the sender's NIC at {ib / 1e9:.0f} GB/s "
            f"(400 Gb/s) carrying every byte once in NCCL's broadcast. These are assumptions, not measurements.", "",
            "| path | model | seconds | anchor |", "| --- | --- | ---: | --- |",
            f"| distributed (full) | gather {gather:.2f} s + {bf16 / 1e9:.0f} GB / {ib / 1e9:.0f} GB/s | {full:.1f} | "
            f"verl full NCCL 32.2 s; NeMo-RL refit 0.5-1.5 s |"]
    if delta_share is not None:
        sparse = bf16 / 2 * delta_share * (4 + 2)  # int32 index + bf16 value per changed element
        rows.append(f"| delta | changed share {delta_share:.4f} (measured at the largest CPU size after one step) "
                    f"-> {sparse / 1e9:.2f} GB | {gather + sparse / ib:.1f} | verl delta 7.1 s |")
    # senders per EP rank (sglang.expert_senders): the EP ranks' senders sit on one node with a NIC each (an HGX
    # H100 node has 8), each sending its 1/8 of the experts; the first also sends the dense part
    experts = 2 * QWEN3_30B_EXPERT_PARAMS
    dense = bf16 - experts
    ep = 8
    busiest = dense + experts / ep
    gather_dense = dense / nvlink  # only the dense part is gathered (TP); experts are whole on their EP rank
    rows.append(f"| distributed, a sender per EP rank ({ep} NICs) | gather {gather_dense:.2f} s + busiest NIC "
                f"{busiest / 1e9:.1f} GB (dense {dense / 1e9:.1f} + experts {experts / 1e9:.0f} / {ep}) / "
                f"{ib / 1e9:.0f} GB/s | {gather_dense + busiest / ib:.1f} | {full / (gather_dense + busiest / ib):.1f}x "
                f"over one sender (assumed links) |")
    rows += ["", f"One sender per pipeline stage caps the rate at one NIC. With a sender per EP rank the experts "
             f"({experts / 1e9:.0f} of the {bf16 / 1e9:.0f} GB) leave over {ep} NICs and the busiest carries the dense "
             f"part and its own experts. The receiving side is not modelled: every engine rank receives every byte, so an "
             f"engine node takes all {bf16 / 1e9:.0f} GB whatever the senders (NCCL spreads it over the node's NICs and "
             f"NVLink; at one NIC's rate that is {bf16 / ib:.1f} s). The CPU run at TP 2 / EP 2 measures the two "
             f"layouts side by side."]
    return rows


def _commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _machine() -> str:
    return f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python " \
           f"{platform.python_version()}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="smallest size, TP/EP 1, every path, one repeat")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=512.0)
    parser.add_argument("--label", default="after")
    parser.add_argument("--src", help="import the project from this checkout (the before column)")
    parser.add_argument("--work", help="scratch directory (checkpoints are reused across runs)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(Path(args.compare[0]), Path(args.compare[1]), Path(args.out)))
        return 0
    src = Path(args.src).resolve() if args.src else ROOT
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    errors = json.loads(run(args).read_text())["errors"]
    if args.quick and errors:  # the quick mode is a check: a failed case is a failure, with its error
        for e in errors:
            print(f"[ws] {e['size']} {e['layout']}: {e['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
