"""Where the default job's time goes: a roofline of this machine and a profile of its three phases.

Roofline: the best achieved GFLOP/s of a large fp32 matmul on one thread (the limit every phase is
measured against) and the copy bandwidth of a large tensor. Phases, on the default job's model and shapes
(configs/grpo.yaml: the tiny Qwen3-MoE, vocabulary 467, random weights, one torch thread):
- sft: one SFT step, 64 sequences of 80-151 tokens (the synthetic-math data's range, mean ~117);
- rollout: one rollout of 64 prompts x 8 samples (prompts 40-60 tokens, responses 16-112 tokens with mean
  64 as the trained model's; random weights emit no EOS, so each request's length is set);
- rl: one GRPO train step on that rollout's 512 samples (engine logprobs, advantages +-1).
Each phase runs once to warm up, once timed, once under torch.profiler. FLOPs are matmul FLOPs
(benchmarks/flops.py); efficiency = achieved GFLOP/s / the matmul limit. Op time is grouped into
matmul, attention, MoE routing/dispatch and other ops; "framework/python" = profiled wall - op self time.

    python benchmarks/profile_phases.py [--phases sft,rollout,rl] [--scale 1.0] [--out results/profile]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flops import forward_flops_per_token, train_flops_per_token  # noqa: E402

VOCAB = 467
CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm", "aten::matmul"),
    "attention": ("scaled_dot_product", "flash_attention", "aten::_softmax", "aten::_softmax_backward_data"),
    "moe routing/dispatch": ("aten::topk", "aten::sort", "aten::argsort", "aten::index", "aten::index_add_",
                             "aten::scatter", "aten::gather", "aten::bincount", "aten::histc", "aten::index_select",
                             "aten::_index_put_impl_", "aten::nonzero", "aten::where", "aten::cumsum",
                             "aten::masked_select", "aten::scatter_add_", "aten::one_hot"),
}


def matmul_limit(size: int = 2048, repeats: int = 3) -> float:
    """Best GFLOP/s of a size^3 fp32 matmul."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def copy_bandwidth(mib: int = 256, repeats: int = 3) -> float:
    """Best GB/s (read + write) copying a `mib` MiB fp32 tensor into a preallocated one."""
    x = torch.randn(mib * 2 ** 18)
    y = torch.empty_like(x)
    y.copy_(x)
    best = min(_seconds(lambda: y.copy_(x)) for _ in range(repeats))
    return 2 * x.numel() * 4 / best / 1e9


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def category_of(name: str) -> str:
    """aten op name -> category (exact aten names, or a substring for the attention kernels)."""
    for category, keys in CATEGORIES.items():
        if any(name == k if k.startswith("aten::") else k in name for k in keys):
            return category
    return "other ops"


def op_breakdown(prof: Any, wall: float, top: int = 15) -> dict:
    """Self CPU seconds per category (+ framework/python = wall - op time) and the top ops."""
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    shares = {c: 0.0 for c in (*CATEGORIES, "other ops")}
    for e in events:
        shares[category_of(e.key)] += e.self_cpu_time_total / 1e6
    op_time = sum(shares.values())
    shares["framework/python"] = max(wall - op_time, 0.0)
    ops = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {"op_seconds": shares, "shares": {k: v / max(wall, 1e-12) for k, v in shares.items()},
            "top_ops": [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in ops]}


def default_model_config() -> Any:
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config import load_config

    model = load_config(Path(__file__).resolve().parents[1] / "configs" / "grpo.yaml").config.model
    return hf_config_from_model_config(model.model_copy(update={"vocab_size": VOCAB}))


def build(cfg: Any):
    from transformers import AutoModelForCausalLM

    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.parallel import init_distributed, init_model_parallel
    from megatron_glue.sharding import shard_megatron_state
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from megatron_glue.weight_names import canonical_hf_state_dict, hf_to_megatron
    from slime_ext.engine.embedded import EmbeddedEngine

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    init_distributed()
    init_model_parallel(ParallelSizes(), seed=0)
    trainer = MegatronTrainer(cfg, TrainerSettings(lr=1e-5, micro_batch_size=16, precision="fp32"), ParallelSizes())
    trainer.load_local_state_dict(shard_megatron_state(hf_to_megatron(canonical_hf_state_dict(hf.state_dict(), cfg), cfg),
                                                       cfg, 0, 1))
    return trainer, EmbeddedEngine(hf, eos_token_id=-1)


def sft_samples(n: int, seed: int = 0) -> list:
    from slime_ext.data import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        total = rng.randint(80, 151)
        prompt = rng.randint(35, 60)
        ids = [rng.randrange(2, VOCAB) for _ in range(total)]
        out.append(Sample(f"sft{i}", ids[:prompt], ids[prompt:]))
    return out


def rollout_requests(prompts: int, per_prompt: int, seed: int = 0) -> list:
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    rng = random.Random(seed)
    reqs = []
    for p in range(prompts):
        ids = [rng.randrange(2, VOCAB) for _ in range(rng.randint(40, 60))]
        for k in range(per_prompt):
            sp = SamplingParams(temperature=1.0, max_new_tokens=rng.randint(16, 112))
            reqs.append(GenerateRequest(f"p{p}-{k}", ids, sp, seed=p * 1000 + k, return_logprob=True))
    return reqs


def rl_samples(requests: list, results: list, seed: int = 0) -> list:
    from slime_ext.data import Sample

    rng = random.Random(seed)
    return [Sample(r.rid, list(r.input_ids), list(res.output_ids), logprobs=list(res.logprobs),
                   advantage=rng.choice([-1.0, 1.0]), reward=0.0) for r, res in zip(requests, results)]


def measure(name: str, fn: Callable[[], Any], tokens: int, flops: float, limit: float) -> dict:
    from torch.profiler import ProfilerActivity, profile

    print(f"[profile] {name}: warm-up", flush=True)
    fn()
    wall = _seconds(fn)
    print(f"[profile] {name}: {wall:.2f} s; profiling", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = _seconds(fn)
    gflops = flops / wall / 1e9
    return {"seconds": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "gflop": flops / 1e9,
            "gflop_per_s": gflops, "efficiency": gflops / limit, "profiled_seconds": profiled,
            **op_breakdown(prof, profiled)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="sft,rollout,rl")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the batches (quick checks)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - {"sft", "rollout", "rl"}
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)} (sft, rollout, rl)")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    limit = matmul_limit(1024 if args.scale < 1 else 2048)
    bandwidth = copy_bandwidth(64 if args.scale < 1 else 256)
    print(f"[profile] matmul limit {limit:.1f} GFLOP/s, copy bandwidth {bandwidth:.1f} GB/s", flush=True)
    cfg = default_model_config()
    trainer, engine = build(cfg)
    results: dict = {}
    if "sft" in phases:
        samples = sft_samples(max(2, round(64 * args.scale)))
        tokens = sum(s.total_len for s in samples)
        flops = sum(s.total_len * train_flops_per_token(cfg, s.total_len) for s in samples)
        results["sft"] = measure("sft", lambda: trainer.train_step(samples, kind="sft"), tokens, flops, limit)
    reqs = rollout_requests(max(1, round(64 * args.scale)), 8)
    outputs: list = []
    if "rollout" in phases or "rl" in phases:
        engine.flush_cache()
        outputs = engine.generate(reqs)
    if "rollout" in phases:
        generated = sum(len(o.output_ids) for o in outputs)
        # prefill: each unique prompt once at mean context len/2; decode: each new token over its context
        prompts = {tuple(r.input_ids) for r in reqs}
        flops = sum(len(p) * forward_flops_per_token(cfg, len(p) / 2) for p in prompts)
        flops += sum(forward_flops_per_token(cfg, len(r.input_ids) + j) for r, o in zip(reqs, outputs)
                     for j in range(len(o.output_ids)))

        def rollout() -> None:
            engine.flush_cache()
            engine.generate(reqs)

        results["rollout"] = measure("rollout", rollout, generated, flops, limit)
    if "rl" in phases:
        samples = rl_samples(reqs, outputs)
        trained = sum(s.total_len for s in samples)
        flops = sum(s.total_len * train_flops_per_token(cfg, s.total_len) for s in samples)
        results["rl"] = measure("rl", lambda: trainer.train_step(samples, kind="grpo"), trained, flops, limit)
    meta = {"command": "python benchmarks/profile_phases.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "scale": args.scale}
    roofline = {"matmul_gflop_per_s": limit, "copy_gb_per_s": bandwidth,
                "forward_gflop_per_token_at_context_117": forward_flops_per_token(cfg, 117) / 1e9,
                "train_gflop_per_token_seq_117": train_flops_per_token(cfg, 117) / 1e9}
    report = {"meta": meta, "roofline": roofline, "phases": results}
    for name, r in results.items():
        print(f"[profile] {name}: {r['seconds']:.2f} s, {r['tokens_per_s']:.0f} tokens/s, {r['gflop_per_s']:.1f} GFLOP/s "
              f"= {r['efficiency']:.0%} of the matmul limit; " +
              ", ".join(f"{k} {v:.0%}" for k, v in r["shares"].items()))
    if args.out:
        write(report, args.out)
    return 0


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "phases.json").write_text(json.dumps(report, indent=2) + "\n")
    meta, roof = report["meta"], report["roofline"]
    lines = ["# Where the default job's time goes", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}; machine: {meta['processor']}, "
             f"{meta['cpu_count']} cores; torch {meta['torch']}, {meta['threads']} thread(s)", "",
             "## Roofline", "", "| quantity | value |", "| --- | ---: |",
             f"| fp32 matmul limit (2048^3, one thread, best of 3) | {roof['matmul_gflop_per_s']:.1f} GFLOP/s |",
             f"| copy bandwidth (256 MiB, best of 3) | {roof['copy_gb_per_s']:.1f} GB/s |",
             f"| model forward, per token at context 117 | {roof['forward_gflop_per_token_at_context_117'] * 1e3:.2f} MFLOP |",
             f"| model training, per token of a 117-token sequence | {roof['train_gflop_per_token_seq_117'] * 1e3:.2f} MFLOP |",
             "", "## Phases", "",
             "| phase | s | tokens | tokens/s | GFLOP | GFLOP/s | of the limit | matmul | attention | MoE routing | other ops | framework/python |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in report["phases"].items():
        s = r["shares"]
        lines.append(f"| {name} | {r['seconds']:.2f} | {r['tokens']} | {r['tokens_per_s']:.0f} | {r['gflop']:.1f} | "
                     f"{r['gflop_per_s']:.1f} | {r['efficiency']:.0%} | {s['matmul']:.0%} | {s['attention']:.0%} | "
                     f"{s['moe routing/dispatch']:.0%} | {s['other ops']:.0%} | {s['framework/python']:.0%} |")
    for name, r in report["phases"].items():
        lines += ["", f"### {name}: top ops by self CPU time (profiled run {r['profiled_seconds']:.2f} s)", "",
                  "| op | self s | calls |", "| --- | ---: | ---: |"]
        lines += [f"| `{o['op']}` | {o['self_s']:.3f} | {o['calls']} |" for o in r["top_ops"]]
    (out / "phases.md").write_text("\n".join(lines) + "\n")
    print(f"[profile] wrote {out}/phases.json and .md")


if __name__ == "__main__":
    raise SystemExit(main())
