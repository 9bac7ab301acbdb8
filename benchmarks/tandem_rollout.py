"""Tandem rollout throughput vs single-model rollout on the same engine, batch and lengths, side by side.

Tandem runs the senior and the junior on every emitted token (two KV caches in lockstep), so on a
compute-bound host its throughput is bounded by about 0.5x a single-model rollout. Both sides use the
embedded engine, the embedded default model (the junior is a second copy, as in self-paired tandem),
the same mixed-length prompts and exactly `--new-tokens` per request (no EOS). Interleaved repeats after
a warm-up; the best of each side is kept.

    python benchmarks/tandem_rollout.py [--batch 64] [--new-tokens 128] [--out results/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.decode import build_model, prompts  # noqa: E402


def run(engine, batch_prompts, new_tokens: int, tandem: bool, vocab: int) -> float:
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    specs = [{"kind": "tandem", "p_senior": 0.5, "kappa": 32, "boundary_ids": list(range(2, vocab, 3))}] if tandem else []
    reqs = [GenerateRequest(f"r{i}", p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens), seed=i,
                            sampler_specs=specs) for i, p in enumerate(batch_prompts)]
    engine.flush_cache()
    start = time.perf_counter()
    out = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    assert all(len(r.output_ids) == new_tokens for r in out)
    if tandem:
        authors = [a["author"] for r in out for a in r.annotations]
        assert 0 < sum(authors) < len(authors), "tandem benchmark produced a single author"
    return elapsed


def main(argv=None) -> int:
    from slime_ext.engine.embedded import EmbeddedEngine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=320)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    senior, junior = build_model(args.vocab, seed=0).to(args.device), build_model(args.vocab, seed=0).to(args.device)
    engine = EmbeddedEngine(senior, eos_token_id=-1, partner=junior)
    batch_prompts = prompts(args.batch, args.vocab)
    print(f"[bench] tandem rollout: batch {args.batch}, {args.new_tokens} new tokens, device {args.device}, "
          f"threads {torch.get_num_threads()}")
    run(engine, batch_prompts[:4], 4, False, args.vocab)  # warm-up
    run(engine, batch_prompts[:4], 4, True, args.vocab)
    timings = {"single": [], "tandem": []}
    for _ in range(args.repeats):
        timings["single"].append(run(engine, batch_prompts, args.new_tokens, False, args.vocab))
        timings["tandem"].append(run(engine, batch_prompts, args.new_tokens, True, args.vocab))
    tokens = args.batch * args.new_tokens
    results = {k: {"seconds": min(v), "tokens_per_s": tokens / min(v), "all_seconds": v} for k, v in timings.items()}
    ratio = results["tandem"]["tokens_per_s"] / results["single"]["tokens_per_s"]
    for k, v in results.items():
        print(f"[bench] {k:6s}: {v['tokens_per_s']:.0f} tokens/s ({v['seconds']:.2f} s)")
    print(f"[bench] ratio tandem / single = {ratio:.2f}x (two forwards per token: bound ~0.5x)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"tandem_rollout_{args.device}"
        meta = {"command": "python benchmarks/tandem_rollout.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
                "device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu x{os.cpu_count()}",
                "threads": torch.get_num_threads(), "torch": torch.__version__, "batch": args.batch,
                "new_tokens": args.new_tokens}
        (args.out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results, "ratio": ratio}, indent=2) + "\n")
        lines = ["# tandem rollout benchmark (embedded engine, tandem vs single model)", "",
                 f"- command: `{meta['command']}`", f"- date: {meta['date']}, device {meta['device']}, torch {meta['torch']}, "
                 f"threads {meta['threads']}, batch {args.batch}, new tokens {args.new_tokens}", "",
                 "| rollout | s (best) | tokens/s |", "| --- | --- | --- |"]
        lines += [f"| {k} | {v['seconds']:.2f} | {v['tokens_per_s']:.0f} |" for k, v in results.items()]
        lines += ["", f"ratio tandem / single = **{ratio:.2f}x** (bound about 0.5x on a compute-bound host)"]
        (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
        print(f"[bench] wrote {args.out}/{name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
