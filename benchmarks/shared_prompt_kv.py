"""Peak memory of the embedded engine's rollout of n samples per prompt, a "before" checkout against this one.

Written to measure the batch's shared prompt KV (before: the commit that still copied the prompt KV into every
sample's row), then reused for the prefix cache's shared blocks (before: the commit whose prefix cache kept a
full copy per finished row). Each side runs in a fresh subprocess that imports the project from its own tree:
"before" from a worktree of the earlier commit (`git worktree add --detach /tmp/kv-before <commit>`), "after"
from this checkout. Both decode the same rollout on the embedded default's model shape
(Qwen3-MoE, hidden 128, 4 layers, 2 KV heads x 32 dims, fp32): `--prompts` prompts of 200-300 tokens x
`--samples` samples, exactly `--new-tokens` tokens each (no EOS), temperature 1, static-KV kernel.

Per side and per prefix-cache setting (the engine's default budget, and 0 tokens, which leaves the batch's
own memory alone), it reports:
- batch_kv_mb: KV tensors held by the generate call's batch state, the largest over the decode steps;
- peak_alloc_mb: the peak of torch's CPU allocations during `generate` above the level before it, from the
  profiler's memory events (allocations and frees in time order, cumulated; an op's own transient
  allocations that it frees before returning are netted out by the profiler);
- peak_rss_delta_mb (default budget only): the process's peak RSS after `generate` minus its RSS before
  (the allocator may reuse memory freed earlier, so this is a lower bound on what the call needed);
- prefix_cache_mb / prefix_cache_tokens (default budget only): what the engine's prefix cache holds after
  `generate`: bytes of the distinct tensor storages reachable from it, and the tokens of its entries' keys
  (each entry's full length, shared or not);
- seconds: wall time of one unprofiled `generate` (after a warm-up call).

    python benchmarks/shared_prompt_kv.py --before /tmp/kv-before [--prompts 16 --samples 8 --new-tokens 64]
        [--out results/benchmarks/shared_prompt_kv]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from before_after import add_arguments, machine_and_date, parse_or_run_child, run_side  # this script's folder

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _state_kv_bytes(state: Any) -> int:
    """KV bytes a static-KV batch state holds, for either layout (a per-row `cache`, or `prompts` + `own`)."""
    pairs = [pair for name in ("cache", "prompts", "own") for pair in (getattr(state, name, None) or [])]
    return sum(t.numel() * t.element_size() for pair in pairs for t in pair)


def _tensors(obj: Any, seen: set[int]) -> Iterator[Any]:
    """Every tensor reachable from `obj` through containers and object attributes (layout-agnostic, so the
    same walk measures a cache of full copies and one of shared blocks)."""
    import torch

    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, seen)
    elif hasattr(obj, "__dict__"):
        yield from _tensors(vars(obj), seen)


def _cache_held(cache: Any) -> dict:
    """Bytes of the distinct storages a prefix cache holds, and its entries' total length in tokens."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(cache, set())}
    return {"prefix_cache_mb": sum(storages.values()) / MB,
            "prefix_cache_tokens": sum(len(key) for key in cache._entries)}


def _requests(args: argparse.Namespace) -> list:
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    rng = random.Random(0)
    prompts = [[rng.randrange(2, args.vocab) for _ in range(rng.randint(200, 300))] for _ in range(args.prompts)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    return [GenerateRequest(f"p{i}s{j}", p, sampling, seed=i * args.samples + j)
            for i, p in enumerate(prompts) for j in range(args.samples)]


def _profiled_peak(run) -> int:
    """Peak of cumulated torch CPU allocation events during `run()`, in bytes above the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    return max(itertools.accumulate(size for _, size in events), default=0)


def child(args: argparse.Namespace) -> dict:
    """One side, in this process: the tree given is imported first."""
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import torch

    torch.set_num_threads(args.threads)
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config.sections import ModelConfig
    from slime_ext.engine import static_kv
    from slime_ext.engine.embedded import EmbeddedEngine
    from transformers import AutoModelForCausalLM

    assert Path(static_kv.__file__).resolve().is_relative_to(Path(args.tree).resolve()), static_kv.__file__
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_from_model_config(
        ModelConfig(vocab_size=args.vocab, max_position_embeddings=1024))).eval()
    held = [0]
    original = static_kv.StaticKVState.step

    def spy(self, tokens):
        held[0] = max(held[0], _state_kv_bytes(self))
        return original(self, tokens)

    static_kv.StaticKVState.step = spy
    requests = _requests(args)
    EmbeddedEngine(model, -1, kernel="static").generate(requests[:2])  # warm-up: kernels, lazy imports
    out: dict[str, Any] = {"tree": str(args.tree)}
    for budget in ("default", 0):
        kwargs = {} if budget == "default" else {"prefix_cache_tokens": 0}
        held[0] = 0
        rss = _rss_bytes()
        start = time.perf_counter()
        engine = EmbeddedEngine(model, -1, kernel="static", **kwargs)
        results = engine.generate(requests)
        seconds = time.perf_counter() - start
        assert all(len(r.output_ids) == args.new_tokens for r in results)
        row = {"batch_kv_mb": held[0] / MB, "seconds": seconds}
        if budget == "default":
            row["peak_rss_delta_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss) / MB
            row.update(_cache_held(engine.prefix_cache))
        del engine
        row["peak_alloc_mb"] = _profiled_peak(
            lambda: EmbeddedEngine(model, -1, kernel="static", **kwargs).generate(requests)) / MB
        out[f"prefix_cache_{budget}"] = row
    return out


def _run_side(tree: Path, args: argparse.Namespace) -> dict:
    return run_side(__file__, tree, ["--prompts", str(args.prompts), "--samples", str(args.samples), "--new-tokens",
                                     str(args.new_tokens), "--vocab", str(args.vocab), "--threads", str(args.threads)],
                    args.threads)


def _markdown(report: dict) -> str:
    lines = ["| side | prefix cache | batch KV (MB) | prefix cache held (MB) | peak torch alloc (MB) "
             "| peak RSS delta (MB) | seconds |", "|---|---|---|---|---|---|---|"]
    for side in ("before", "after"):
        for budget in ("default", "0"):
            r = report[side][f"prefix_cache_{budget}"]
            rss = f"{r['peak_rss_delta_mb']:.1f}" if "peak_rss_delta_mb" in r else "-"
            held = f"{r['prefix_cache_mb']:.1f}" if "prefix_cache_mb" in r else "-"
            lines.append(f"| {side} | {budget} | {r['batch_kv_mb']:.1f} | {held} | {r['peak_alloc_mb']:.1f} | {rss} "
                         f"| {r['seconds']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=320)
    add_arguments(parser, ROOT)
    args = parse_or_run_child(parser, argv, child)
    if args is None:
        return 0
    report = {"workload": {"prompts": args.prompts, "samples": args.samples, "prompt_tokens": "200-300",
                           "new_tokens": args.new_tokens, "vocab": args.vocab, "threads": args.threads,
                           "model": "embedded default shape (ModelConfig defaults), fp32"},
              **machine_and_date()}
    report["before"] = _run_side(args.before, args)
    report["after"] = _run_side(ROOT, args)
    table = _markdown(report)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "shared_prompt_kv.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
