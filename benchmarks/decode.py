"""Decode throughput: the embedded engine vs HF transformers `generate()`, side by side in one run.

Same model (the embedded default, a ~3.4M-parameter Qwen3-MoE), same batch of prompts (mixed lengths,
left-padded for HF), same decoding: sampled (temperature 1, no top-k / top-p) and greedy. Two workloads,
each decoded both ways:
- fixed: every request generates exactly `--new-tokens` (no EOS): raw batched decode speed;
- ragged: request i needs a length drawn from [new_tokens/8, new_tokens] (as RL responses end at
  different times). The embedded engine stops each row at its own length and drops it from the batch;
  `generate()` has one limit per batch, so it runs to the longest. Both are credited only with the
  tokens the requests need (useful tokens/s).
Each side runs `--repeats` times after a warm-up (interleaved) and the best is kept; prefill included.

    python benchmarks/decode.py [--batch 64] [--new-tokens 128] [--out results/benchmarks]
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_model(vocab: int, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config.sections import ModelConfig

    torch.manual_seed(seed)
    hf = hf_config_from_model_config(ModelConfig(vocab_size=vocab, max_position_embeddings=1024))
    return AutoModelForCausalLM.from_config(hf).eval()


def prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(60, 120))] for _ in range(batch)]


def ragged_lengths(batch: int, new_tokens: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(max(1, new_tokens // 8), new_tokens) for _ in range(batch)]


def run_embedded(model, batch_prompts, new_tokens: int, lengths: list[int] | None = None, greedy: bool = False,
                 kernel: str = "auto") -> float:
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine(model, eos_token_id=-1, kernel=kernel)
    lengths = lengths or [new_tokens] * len(batch_prompts)
    temperature = 0.0 if greedy else 1.0
    reqs = [GenerateRequest(f"r{i}", p, SamplingParams(temperature=temperature, max_new_tokens=n), seed=i)
            for i, (p, n) in enumerate(zip(batch_prompts, lengths))]
    start = time.perf_counter()
    out = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    assert [len(r.output_ids) for r in out] == lengths
    return elapsed


def run_hf(model, batch_prompts, new_tokens: int, greedy: bool = False) -> float:
    width = max(len(p) for p in batch_prompts)
    ids = torch.zeros(len(batch_prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch_prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.no_grad():
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             eos_token_id=None, pad_token_id=0, **sampling)
    if out.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + new_tokens
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=320)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = build_model(args.vocab)
    batch_prompts = prompts(args.batch, args.vocab)
    generated = args.batch * args.new_tokens
    print(f"[bench] decode: batch {args.batch}, {args.new_tokens} new tokens each, threads {torch.get_num_threads()}")
    lengths = ragged_lengths(args.batch, args.new_tokens)
    workloads = {f"{shape}_{mode}": (shape == "ragged", mode == "greedy")
                 for shape in ("fixed", "ragged") for mode in ("sampled", "greedy")}
    useful = {w: (sum(lengths) if ragged else generated) for w, (ragged, _) in workloads.items()}
    timings = {(w, e): [] for w in workloads for e in ("embedded_engine", "hf_generate")}
    run_embedded(model, batch_prompts[:4], 4)  # warm-up
    run_hf(model, batch_prompts[:4], 4)
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both sides alike
        for w, (ragged, greedy) in workloads.items():
            timings[w, "embedded_engine"].append(run_embedded(model, batch_prompts, args.new_tokens,
                                                              lengths if ragged else None, greedy))
            timings[w, "hf_generate"].append(run_hf(model, batch_prompts, max(lengths) if ragged else args.new_tokens,
                                                    greedy))
    results: dict = {}
    for (workload, engine), values in timings.items():
        best = min(values)
        results.setdefault(workload, {})[engine] = {"seconds": best, "tokens_per_s": useful[workload] / best,
                                                     "all_seconds": values}
    ratios = {w: r["embedded_engine"]["tokens_per_s"] / r["hf_generate"]["tokens_per_s"] for w, r in results.items()}
    for workload, per in results.items():
        for engine, v in per.items():
            print(f"[bench] {workload:14s} {engine}: {v['tokens_per_s']:.0f} useful tokens/s ({v['seconds']:.2f} s)")
        print(f"[bench] {workload:14s} ratio embedded / hf generate = {ratios[workload]:.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"command": "python benchmarks/decode.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
                "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                "batch": args.batch, "new_tokens": args.new_tokens}
        (args.out / "decode.json").write_text(json.dumps({"meta": meta, "results": results, "ratios": ratios}, indent=2) + "\n")
        lines = ["# decode benchmark (embedded engine vs HF generate)", "", f"- command: `{meta['command']}`",
                 f"- date: {meta['date']}, torch {meta['torch']}, threads {meta['threads']}, batch {args.batch}, "
                 f"new tokens {args.new_tokens}", "",
                 "| workload | engine | s (best of repeats) | useful tokens/s | embedded / HF |", "| --- | --- | --- | --- | --- |"]
        for workload, per in results.items():
            for engine, v in per.items():
                lines.append(f"| {workload} | {engine} | {v['seconds']:.2f} | {v['tokens_per_s']:.0f} | {ratios[workload]:.2f}x |")
        (args.out / "decode.md").write_text("\n".join(lines) + "\n")
        print(f"[bench] wrote {args.out}/decode.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
