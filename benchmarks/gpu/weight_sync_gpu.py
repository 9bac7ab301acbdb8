"""Weight sync on one GPU: the transports a trainer process uses to reach an engine process, tensors on the device.

Sections (each fails on its own; results in `weight_sync_gpu.json` / `.md` under `--out`):
- `nccl`: a trainer process broadcasts a Qwen3-MoE-shaped state (`--size`, bf16) bucket by bucket as one flat
  byte tensor per bucket (SGLang's `flattened_bucket`) over NCCL to an engine process on the same GPU, which
  writes it into its own parameters and verifies every tensor's checksum (`sglang_patches.weight_payload`).
  NCCL normally refuses two ranks on one device; the section records what happened.
- `ipc`: the colocated `tensor` path: the trainer encodes each bucket as a checksummed payload on the GPU,
  pickles it with torch's CUDA IPC reductions (only handles cross the pipe), the engine process opens the
  handles, applies and verifies. Bytes through the pipe against bytes of weights.
- `delta`: fp32 master weights of the same shape and an Adam step at lr 3e-5 (random gradients), then the
  bf16 delta against the previous bf16 weights: changed share, payload bytes against dense, encode and
  apply+verify seconds, on the GPU.

    python3 benchmarks/gpu/weight_sync_gpu.py --out $OUT [--size 560M] [--sections nccl,ipc,delta]
    python3 benchmarks/gpu/weight_sync_gpu.py --dry --out /tmp/x   # CPU, tiny (gloo for nccl; the tests)
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import socket
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sglang_patches import weight_payload  # noqa: E402  (plain torch: travels without slime_ext's deps)

SHAPES = {  # (hidden, layers, experts, moe_ffn, vocab) as benchmarks/weight_sync_scaling.py
    "tiny": (64, 2, 4, 64, 1024),
    "560M": (1024, 8, 32, 512, 65536),
    "2B": (2048, 12, 32, 768, 151936),
}


def named_shapes(size: str) -> list[tuple[str, tuple[int, ...]]]:
    hidden, layers, experts, moe_ffn, vocab = SHAPES[size]
    hd, kv, heads = 64, 2, max(2, hidden // 64)
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (hidden,)), (p + "self_attn.q_proj.weight", (heads * hd, hidden)),
                (p + "self_attn.k_proj.weight", (kv * hd, hidden)), (p + "self_attn.v_proj.weight", (kv * hd, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, heads * hd)), (p + "mlp.gate.weight", (experts, hidden))]
        for j in range(experts):
            e = p + f"mlp.experts.{j}."
            out += [(e + "gate_proj.weight", (moe_ffn, hidden)), (e + "up_proj.weight", (moe_ffn, hidden)),
                    (e + "down_proj.weight", (hidden, moe_ffn))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def make_state(size: str, device: str, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {n: (0.02 * torch.randn(s, generator=gen, device=device, dtype=torch.float32)).to(dtype)
            for n, s in named_shapes(size)}


def buckets(state: dict[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    out, cur, filled = [], [], 0
    for n, t in state.items():
        cur.append(n)
        filled += t.numel() * t.element_size()
        if filled >= bucket_bytes:
            out.append(cur)
            cur, filled = [], 0
    return out + ([cur] if cur else [])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- nccl: trainer -> engine broadcast on one device ---------------------------------------------
def _nccl_rank(rank: int, size: str, port: int, backend: str, device: str, bucket_bytes: int, queue: Any) -> None:
    try:
        torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
        state = make_state(size, device, torch.bfloat16, seed=1 if rank == 0 else 2)  # the engine holds others
        plan = buckets(state, bucket_bytes)
        sums = torch.tensor([weight_payload.checksum(state[n]) for n in state], device=device) if rank == 0 else \
            torch.empty(len(state), dtype=torch.int64, device=device)
        _sync(device)
        t0 = time.perf_counter()
        for names in plan:
            if rank == 0:
                flat = torch.cat([state[n].view(-1).view(torch.uint8) for n in names])
            else:
                flat = torch.empty(sum(state[n].numel() * 2 for n in names), dtype=torch.uint8, device=device)
            torch.distributed.broadcast(flat, src=0)
            if rank == 1:
                start = 0
                for n in names:
                    nbytes = state[n].numel() * 2
                    state[n].copy_(flat[start:start + nbytes].view(torch.bfloat16).view_as(state[n]))
                    start += nbytes
        _sync(device)
        seconds = time.perf_counter() - t0
        torch.distributed.broadcast(sums, src=0)
        bad = [n for n, want in zip(state, sums.tolist()) if weight_payload.checksum(state[n]) != want] if rank == 1 else []
        total = sum(t.numel() * 2 for t in state.values())
        queue.put({"rank": rank, "seconds": seconds, "bytes": total, "buckets": len(plan), "checksum_failures": len(bad),
                   "GBps": total / seconds / 1e9, "on_device": all(t.is_cuda for t in state.values()) or device == "cpu"})
        torch.distributed.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:2000]})


def section_nccl(args: argparse.Namespace) -> dict:
    backend, device = ("gloo", "cpu") if args.dry else ("nccl", "cuda:0")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_nccl_rank, args=(r, args.size, port, backend, device, args.bucket_mb << 20, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    results = []
    deadline = time.time() + args.section_timeout
    while len(results) < 2 and time.time() < deadline:
        try:
            results.append(queue.get(timeout=5))
        except Exception:  # noqa: BLE001 - queue.Empty: still running
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    out = {"backend": backend, "size": args.size, "ranks": sorted(results, key=lambda r: r["rank"])}
    out["ok"] = len(results) == 2 and all("error" not in r for r in results) and \
        all(r.get("checksum_failures", 0) == 0 for r in results)
    if not out["ok"]:
        out["error"] = "; ".join(r.get("error", "") for r in results if "error" in r) or "no result in time"
    return out


# -- ipc: the colocated tensor path --------------------------------------------------------------
def _ipc_engine(conn: Any, size: str, device: str) -> None:
    try:
        import pickle

        state = make_state(size, device, torch.bfloat16, seed=2)
        _sync(device)
        conn.send_bytes(b"ready")  # the engine's weights and CUDA context exist: the sender starts its clock
        received = verified = 0
        t_apply = 0.0
        while True:
            data = conn.recv_bytes()
            if not data:
                break
            received += len(data)
            payload = pickle.loads(data)
            t0 = time.perf_counter()
            verified += weight_payload.apply_payload(payload, state.__getitem__)
            _sync(device)
            t_apply += time.perf_counter() - t0
            del payload
            conn.send_bytes(b"ok")
        conn.send({"pipe_bytes": received, "verified": verified, "apply_verify_s": t_apply,
                   "on_device": all(t.device.type == torch.device(device).type for t in state.values())})
    except BaseException as exc:  # noqa: BLE001
        conn.send({"error": f"{type(exc).__name__}: {exc}"[:2000]})


def section_ipc(args: argparse.Namespace) -> dict:
    from multiprocessing.reduction import ForkingPickler

    device = "cpu" if args.dry else "cuda:0"
    if args.dry:
        torch.multiprocessing.set_sharing_strategy("file_system")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ipc_engine, args=(child, args.size, device))
    proc.start()
    state = make_state(args.size, device, torch.bfloat16, seed=1)
    total = sum(t.numel() * 2 for t in state.values())
    _sync(device)
    if parent.recv_bytes() != b"ready":
        raise RuntimeError("the engine process did not start")
    t0 = time.perf_counter()
    per_bucket = []
    for names in buckets(state, args.bucket_mb << 20):
        t_bucket = time.perf_counter()
        payload = []
        for n in names:
            payload += weight_payload.encode(n, state[n], None)[0]
        buf = io.BytesIO()
        ForkingPickler(buf).dump(payload)
        parent.send_bytes(buf.getvalue())
        if parent.recv_bytes() != b"ok":  # the engine applied it: the sender may drop the bucket
            break
        per_bucket.append(time.perf_counter() - t_bucket)
    parent.send_bytes(b"")
    seconds = time.perf_counter() - t0
    result = parent.recv()
    proc.join(timeout=30)
    return {"ok": "error" not in result and result.get("verified") == len(state), "device": device, "size": args.size,
            "seconds": seconds, "weight_bytes": total, "GBps": total / seconds / 1e9, "bucket_seconds": per_bucket,
            **result}


# -- delta: changed share after an Adam step -----------------------------------------------------
def section_delta(args: argparse.Namespace) -> dict:
    device = "cpu" if args.dry else "cuda:0"
    master = {n: t.float().requires_grad_(True) for n, t in make_state(args.size, device, torch.float32, 1).items()}
    opt = torch.optim.Adam(master.values(), lr=3e-5, betas=(0.9, 0.98), eps=1e-8)
    previous = {n: t.detach().to(torch.bfloat16) for n, t in master.items()}
    engine = {n: t.clone() for n, t in previous.items()}
    steps = []
    gen = torch.Generator(device=device).manual_seed(3)
    for step in range(args.delta_steps):
        for t in master.values():
            t.grad = 1e-3 * torch.randn(t.shape, generator=gen, device=device)
        opt.step()
        _sync(device)
        t0 = time.perf_counter()
        payload, changed, elements = [], 0, 0
        for n, t in master.items():
            value = t.detach().to(torch.bfloat16)
            entries, c = weight_payload.encode(n, value, previous[n])
            payload += entries
            changed += c
            elements += value.numel()
            previous[n] = value
        _sync(device)
        t_encode = time.perf_counter() - t0
        t0 = time.perf_counter()
        verified = weight_payload.apply_payload(payload, engine.__getitem__)
        _sync(device)
        t_apply = time.perf_counter() - t0
        steps.append({"step": step + 1, "changed_share": changed / elements, "payload_bytes": weight_payload.payload_bytes(payload),
                      "dense_bytes": 2 * elements, "encode_s": t_encode, "apply_verify_s": t_apply, "verified": verified})
    ok = all(s["verified"] == len(master) for s in steps) and all(torch.equal(engine[n], previous[n]) for n in master)
    return {"ok": ok, "device": device, "size": args.size, "params": sum(t.numel() for t in master.values()),
            "steps": steps}


SECTIONS: dict[str, Callable[[argparse.Namespace], dict]] = {"nccl": section_nccl, "ipc": section_ipc,
                                                              "delta": section_delta}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="560M", choices=list(SHAPES))
    parser.add_argument("--sections", default="nccl,ipc,delta")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--delta-steps", type=int, default=2)
    parser.add_argument("--section-timeout", type=float, default=180.0)
    parser.add_argument("--dry", action="store_true", help="CPU, tiny shapes (gloo instead of NCCL)")
    args = parser.parse_args(argv)
    if args.dry:
        args.size = "tiny"
        args.bucket_mb = 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "machine": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor(),
                              "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                              if torch.cuda.is_available() else None, "python": platform.python_version(),
                              "command": " ".join([sys.executable, *sys.argv]), "sections": {}}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            report["sections"][name] = SECTIONS[name](args)
        except BaseException as exc:  # noqa: BLE001 - one section's failure does not stop the others
            report["sections"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc()[-3000:]}
        report["sections"][name]["wall_s"] = time.perf_counter() - t0
        print(f"[weight-sync-gpu] {name}: {json.dumps(report['sections'][name])[:1500]}", flush=True)
        (out / "weight_sync_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(s.get("ok") for s in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
