"""DUET's controller cost: allocation, marker checks and reweighting, against the rollout they steer.

Side by side in one run on the same engine, model and prompts: the rollout of a DUET step (64 prompts,
n_q from the allocator, the marker gate on every request) and the same rollout without the gate; plus
the method's own plan / finish time. Prints the controller share of the rollout phase: an upper bound
on its share of the whole step (which also trains). Uses the synthetic math task and a checkpoint
(`--model`, e.g. a cached SFT warm start: a trained model emits the marker, a random one would not).

    python benchmarks/duet_controller.py [--model HF_DIR] [--prompts 64] [--out results/benchmarks]
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


def main(argv=None) -> int:
    from slime_ext.config import load_config
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.methods.base import PromptPlan
    from slime_ext.methods.registry import build_method
    from slime_ext.orchestration.rollout_manager import RolloutManager
    from slime_ext.methods.registry import data_transform
    from slime_ext.tasks.prepare import prepare_data
    from slime_ext.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF checkpoint dir with tokenizer (e.g. .cache/slime_ext/warmstart/*/hf)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    repo = Path(__file__).resolve().parents[1]
    over = [f"rollout.prompts_per_step={args.prompts}"]
    # the duet section is part of the DUET run's config only (a GRPO config has no such section)
    duet_cfg = load_config(repo / "configs" / "duet.yaml", [*over, "duet.budget_fraction=0.5"]).config
    grpo_cfg = load_config(repo / "configs" / "grpo.yaml", over).config
    data = prepare_data(duet_cfg.data, duet_cfg.run.cache_dir, data_transform(duet_cfg))
    tok = load_tokenizer(args.model)
    engine = EmbeddedEngine.from_pretrained(args.model)
    timings: dict[str, list[float]] = {"rollout_with_gate": [], "rollout_without_gate": [], "controller": []}
    tokens = {}
    for rep in range(args.repeats):
        duet = RolloutManager(duet_cfg, data.train, tok, engine)
        t0 = time.perf_counter()
        groups, metrics = duet.rollout(rep)
        timings["rollout_with_gate"].append(time.perf_counter() - t0 - metrics["time/controller"])
        timings["controller"].append(metrics["time/controller"])
        tokens["with_gate"] = metrics["rollout/generated_tokens"]
        # the same prompts and counts, no gate: GRPO's plan with DUET's n_q
        counts = [len(g) for g in groups]
        plain = RolloutManager(grpo_cfg, data.train, tok, engine, method=build_method(grpo_cfg))
        plain.method.plan = lambda prompts, step, c=counts, sp=plain.method.sampling: [PromptPlan(n, sp) for n in c]
        t0 = time.perf_counter()
        _, pm = plain.rollout(rep)
        timings["rollout_without_gate"].append(time.perf_counter() - t0)
        tokens["without_gate"] = pm["rollout/generated_tokens"]
    best = {k: min(v) for k, v in timings.items()}
    share = best["controller"] / (best["rollout_with_gate"] + best["controller"])
    gate_tok_s = tokens["with_gate"] / best["rollout_with_gate"]
    plain_tok_s = tokens["without_gate"] / best["rollout_without_gate"]
    print(f"[bench] controller (plan + finish): {best['controller'] * 1e3:.1f} ms per step")
    print(f"[bench] rollout with gate: {best['rollout_with_gate']:.2f} s ({gate_tok_s:.0f} tokens/s); "
          f"without: {best['rollout_without_gate']:.2f} s ({plain_tok_s:.0f} tokens/s)")
    print(f"[bench] controller share of the rollout phase = {share:.2%} (upper bound on its share of a step)")
    print(f"[bench] gate-on throughput / gate-off throughput = {gate_tok_s / plain_tok_s:.2f}x "
          f"(marker checks inside the engine)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"command": "python benchmarks/duet_controller.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
                "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__}
        result = {"meta": meta, "timings": timings, "tokens": tokens, "controller_share": share,
                  "gate_throughput_ratio": gate_tok_s / plain_tok_s}
        (args.out / "duet_controller.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "duet_controller.md").write_text(
            "# DUET controller cost\n\n" f"- command: `{meta['command']}`\n- date: {meta['date']}, torch {meta['torch']}, "
            f"threads {meta['threads']}\n\n| quantity | value |\n| --- | --- |\n"
            f"| controller (plan + finish) per step | {best['controller'] * 1e3:.1f} ms |\n"
            f"| rollout with gate | {best['rollout_with_gate']:.2f} s ({gate_tok_s:.0f} tokens/s) |\n"
            f"| rollout without gate (same prompts and counts) | {best['rollout_without_gate']:.2f} s ({plain_tok_s:.0f} tokens/s) |\n"
            f"| controller share of the rollout phase | **{share:.2%}** |\n"
            f"| gate-on / gate-off throughput | {gate_tok_s / plain_tok_s:.2f}x |\n")
        print(f"[bench] wrote {args.out}/duet_controller.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
