"""Peak memory and time of the train step and of the log-prob pass against sequence length, at Qwen3-30B-A3B widths.

The model is a slice of Qwen3-30B-A3B (hidden 2048, vocabulary 151,936, 32 query / 4 key-value heads of 128,
expert FFN 768, untied head) with `--layers` layers (default 1) and `--experts` experts (default 4, top-2) so it
fits this machine; fp32 on the CPU. Each case runs in a fresh process: the model is built, one step on a
16-token batch creates the Adam states, then the log-prob pass and one train step on a micro-batch of one
T-token sequence (half prompt, half response) are measured: peak bytes of torch tensors
(`megatron_glue.memory_meter.PeakMemory`: live tensors at the start plus the allocator's records; GPU: the CUDA
allocator's peak) and seconds. Implementations, side by side in one run:
- `ours`: this checkout's Megatron trainer (GRPO loss, chunked LM-head log-probs);
- `before`: the trainer imported from `--src` (e.g. a worktree of the commit before the chunked log-probs);
- `hf`: plain transformers training of the same model and batch (fp32 AdamW, full log-softmax), the baseline;
- with `--lora`: `lora` (our trainer with `train.lora` at `--lora-rank` on the attention projections) and
  `lora_experts` (the same plus every expert's fc1 / fc2): the trainer's memory when only adapters train.
A case whose peak, extrapolated linearly from the measured lengths of its implementation, would not fit the
machine's available memory is skipped with that reason (a child killed for memory would take the machine's
other work with it).

    python benchmarks/memory_scaling.py --out results/benchmarks/memory_scaling --src /tmp/before  # 1k, 4k, 16k
    python benchmarks/memory_scaling.py --quick --out /tmp/mem     # 1k and 4k, ours and hf: memory_quick.json
    python benchmarks/memory_scaling.py --quick --toy --out /tmp/mem   # small widths, seconds (the test)
    python benchmarks/memory_scaling.py --lora --lengths 1024 --out /tmp/mem_lora   # full training against LoRA
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
CHILD_RESULT = "MEMORY_CHILD "
WIDTHS = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
              moe_intermediate_size=768, vocab_size=151936)
TOY_WIDTHS = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                  moe_intermediate_size=128, vocab_size=16384)
LENGTHS = (1024, 4096, 16384)
QUICK_LENGTHS = (1024, 4096)
WARM_TOKENS = 16


def hf_config(widths: dict, layers: int, experts: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(num_hidden_layers=layers, num_experts=experts, num_experts_per_tok=2, norm_topk_prob=True,
                          router_aux_loss_coef=0.0, intermediate_size=4 * widths["hidden_size"],
                          max_position_embeddings=max(LENGTHS) + 16, tie_word_embeddings=False,
                          rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, **widths)


def _meter() -> Any:
    """This checkout's meter, also when the measured code is imported from another checkout (`before`)."""
    spec = importlib.util.spec_from_file_location("memory_meter_of_the_benchmark", ROOT / "megatron_glue/memory_meter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PeakMemory


def _tokens(vocab: int, n: int, seed: int) -> list[int]:
    import torch

    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _measure(label: str, fn: Any) -> dict:
    PeakMemory = _meter()
    with PeakMemory() as meter:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    return {f"{label}_peak_bytes": meter.peak_bytes, f"{label}_seconds": seconds, f"{label}_start_bytes": meter.start_bytes}


LORA_IMPLS = {"lora": ("linear_qkv", "linear_proj"), "lora_experts": ("linear_qkv", "linear_proj", "experts")}
IMPLS = ("ours", "before", "hf", *LORA_IMPLS)


def run_megatron(config: Any, tokens: int, chunk_mb: Optional[float] = None, lora: Any = None) -> dict:
    import torch

    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.parallel import init_distributed, init_model_parallel
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from slime_ext.data import Sample

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    init_distributed()
    init_model_parallel(ParallelSizes(), seed=0)
    torch.manual_seed(0)
    extra = {"logprob_chunk_mb": chunk_mb} if chunk_mb else {}  # None: the trainer's default
    if lora is not None:
        extra["lora"] = lora
    trainer = MegatronTrainer(config, TrainerSettings(lr=1e-5, micro_batch_size=1, **extra), ParallelSizes())

    def sample(n: int, seed: int) -> list:
        half = n // 2
        return [Sample(f"s{seed}", _tokens(config.vocab_size, half, seed), _tokens(config.vocab_size, n - half, seed + 1),
                       logprobs=[-1.0] * (n - half), advantage=1.0)]

    trainer.train_step(sample(WARM_TOKENS, 0), kind="grpo")  # Adam states exist from here on
    batch = sample(tokens, 2)
    out = _measure("logprobs", lambda: trainer.compute_logprobs(batch, with_entropy=True))
    out.update(_measure("train", lambda: trainer.train_step(batch, kind="grpo")))
    out["trained_params"] = sum(p.numel() for p in trainer.model.module.parameters() if p.requires_grad)
    return out


def run_hf(config: Any, tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)

    def logprobs(ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids).logits.float()
        return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]

    def step(n: int, seed: int) -> None:
        ids = torch.tensor([_tokens(config.vocab_size, n, seed)])
        opt.zero_grad(set_to_none=True)
        (-logprobs(ids)[:, n // 2 - 1:].mean()).backward()  # the response half, as ours trains
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step(WARM_TOKENS, 0)
    ids = torch.tensor([_tokens(config.vocab_size, tokens, 2)])

    def forward_only() -> None:
        with torch.no_grad():
            logprobs(ids)

    out = _measure("logprobs", forward_only)
    out.update(_measure("train", lambda: step(tokens, 2)))
    return out


def child(args: argparse.Namespace) -> int:
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
    else:
        sys.path.insert(0, str(ROOT))
    config = hf_config(TOY_WIDTHS if args.toy else WIDTHS, args.layers, args.experts)
    if args.child == "hf":
        result = run_hf(config, args.tokens)
    elif args.child in LORA_IMPLS:
        from megatron_glue.lora import LoRASpec

        spec = LoRASpec(rank=args.lora_rank, alpha=2.0 * args.lora_rank, target_modules=LORA_IMPLS[args.child])
        result = run_megatron(config, args.tokens, args.logprob_chunk_mb, lora=spec)
    else:
        result = run_megatron(config, args.tokens, args.logprob_chunk_mb if args.child == "ours" else None)
    print(CHILD_RESULT + json.dumps(result), flush=True)
    return 0


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def _predicted_peak(rows: list[dict], impl: str, tokens: int) -> Optional[float]:
    """Linear in tokens through this implementation's two longest measured lengths (None with fewer)."""
    done = sorted((r["tokens"], r["train_peak_bytes"]) for r in rows if r["impl"] == impl and "train_peak_bytes" in r)
    if len(done) < 2:
        return None
    (t0, p0), (t1, p1) = done[-2], done[-1]
    return p1 + (p1 - p0) / (t1 - t0) * (tokens - t1)


def run_case(impl: str, tokens: int, args: argparse.Namespace, log: Any) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, "--tokens", str(tokens),
           "--layers", str(args.layers), "--experts", str(args.experts), "--out", "/tmp",
           "--lora-rank", str(args.lora_rank)]
    if args.toy:
        cmd.append("--toy")
    if args.logprob_chunk_mb:
        cmd += ["--logprob-chunk-mb", str(args.logprob_chunk_mb)]
    if impl == "before":
        cmd += ["--src", str(args.src)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    # a world of its own: a rendezvous address inherited from a parent that runs torch.distributed is taken
    for key in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(args.src if impl == "before" else ROOT),
                          timeout=args.case_timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(CHILD_RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{impl} at {tokens} tokens failed (exit {done.returncode}): "
                           f"{(done.stdout + done.stderr)[-1500:]}")
    row = {"impl": impl, "tokens": tokens, **json.loads(lines[-1][len(CHILD_RESULT):]),
           "case_seconds": time.perf_counter() - t0}
    log(f"[mem] {impl:<6} {tokens:>6} tokens: train peak {row['train_peak_bytes'] / 2**30:6.2f} GiB "
        f"{row['train_seconds']:7.1f} s | logprobs peak {row['logprobs_peak_bytes'] / 2**30:6.2f} GiB "
        f"{row['logprobs_seconds']:6.1f} s")
    return row


def _machine() -> str:
    return f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, " \
           f"{_available_bytes() / 2**30:.1f} GiB available, Python {platform.python_version()}"


def _commit(path: Path) -> str:
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def table(rows: list[dict], skipped: list[dict]) -> str:
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows + skipped)]
    lengths = sorted({r["tokens"] for r in rows + skipped})
    out = ["| tokens | " + " | ".join(f"{i} train peak GiB | {i} train s | {i} logprobs peak GiB" for i in impls) + " |",
           "| ---: |" + " ---: | ---: | ---: |" * len(impls)]
    for t in lengths:
        cells = []
        for i in impls:
            r = next((r for r in rows if r["impl"] == i and r["tokens"] == t), None)
            if r is None:
                cells += ["skipped", "-", "-"]
            else:
                cells += [f"{r['train_peak_bytes'] / 2**30:.2f}", f"{r['train_seconds']:.1f}",
                          f"{r['logprobs_peak_bytes'] / 2**30:.2f}"]
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, style in (("ours", "o-"), ("before", "s--"), ("hf", "^:"), ("lora", "d-."), ("lora_experts", "v-.")):
        pts = sorted((r["tokens"], r["train_peak_bytes"] / 2**30) for r in rows if r["impl"] == impl)
        if pts:
            ax.plot(*zip(*pts), style, label=f"{impl} train step")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the micro-batch")
    ax.set_ylabel("peak GiB (torch tensors)")
    ax.set_title("Train-step peak memory, hidden 2048, vocabulary 151,936")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="1k and 4k tokens, ours and hf; writes memory_quick.json")
    parser.add_argument("--toy", action="store_true", help="small widths (hidden 256, vocabulary 16384): seconds")
    parser.add_argument("--src", help="a checkout of the code before the change: the `before` column")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--case-timeout", type=float, default=1800)
    parser.add_argument("--logprob-chunk-mb", type=float, default=None,
                        help="our trainer's train.logprob_chunk_mb (default: the trainer's default)")
    parser.add_argument("--lora", action="store_true",
                        help="also our trainer with LoRA adapters: on attention (lora) and on attention + experts")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    impls = ["ours", "hf"] + (["before"] if args.src else []) + (list(LORA_IMPLS) if args.lora else [])
    result: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]), "machine": _machine(), "commit": _commit(ROOT),
        "before_commit": _commit(Path(args.src)) if args.src else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch_threads": os.environ.get("OMP_NUM_THREADS", "2"),
        "model": {**(TOY_WIDTHS if args.toy else WIDTHS), "layers": args.layers, "experts": args.experts, "top_k": 2},
        "lora_rank": args.lora_rank if args.lora else None,
        "logprob_chunk_mb": args.logprob_chunk_mb, "rows": [], "skipped": []}
    rows, skipped = result["rows"], result["skipped"]
    log_file = (out / "memory_scaling.log").open("a")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    for tokens in lengths:
        for impl in impls:
            predicted = _predicted_peak(rows, impl, tokens)
            if predicted is not None and predicted > 0.85 * _available_bytes():
                skipped.append({"impl": impl, "tokens": tokens, "reason": f"predicted peak {predicted / 2**30:.1f} GiB "
                                f"> 85% of the {_available_bytes() / 2**30:.1f} GiB available"})
                log(f"[mem] {impl:<6} {tokens:>6} tokens: skipped ({skipped[-1]['reason']})")
                continue
            try:
                rows.append(run_case(impl, tokens, args, log))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                skipped.append({"impl": impl, "tokens": tokens, "reason": str(exc)[-500:]})
                log(f"[mem] {impl:<6} {tokens:>6} tokens: FAILED {str(exc)[:300]}")
            (out / "memory_scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "memory_scaling.md").write_text(
        f"# Memory against length\n\n- command: `{result['command']}`\n- machine: {result['machine']}\n"
        f"- date: {result['date']}; commit {result['commit']} (before: {result['before_commit']})\n"
        f"- model: {result['model']}\n\n{table(rows, skipped)}\n\n"
        + "".join(f"- skipped {s['impl']} at {s['tokens']}: {s['reason']}\n" for s in skipped)
        + "".join(f"- {impl}: {n:,} trained parameters\n" for impl, n in
                  {r["impl"]: r["trained_params"] for r in rows if "trained_params" in r}.items()))
    plot(rows, out / "memory_scaling.png")
    if args.quick:
        quick = {"rows": [{"tokens": t, "ours_peak_bytes": o["train_peak_bytes"], "hf_peak_bytes": h["train_peak_bytes"]}
                          for t in lengths
                          for o in [next((r for r in rows if r["impl"] == "ours" and r["tokens"] == t), None)]
                          for h in [next((r for r in rows if r["impl"] == "hf" and r["tokens"] == t), None)]
                          if o and h]}
        (out / "memory_quick.json").write_text(json.dumps(quick, indent=1) + "\n")
        if len(quick["rows"]) != len(lengths):
            print(f"error: not every length ran: {skipped}", file=sys.stderr)
            return 1
    log(f"[mem] wrote {out / 'memory_scaling.json'}, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
