"""Tandem's handoff evaluation (team rollouts), a "before" checkout against this one, side by side.

Written for the prefix cache's trie index (before: the commit whose cache compared every lookup and insertion with
every entry). A handoff evaluation feeds each turn's prompt + output back to the engine whose turn it is, so its
engines cache thousands of entries, and a scan per lookup made the evaluation quadratic in them. Each side runs
`team_rollouts` in a fresh subprocess importing the project from its own tree (benchmarks/before_after.py): the same
senior and junior checkpoints, `--prompts` rows of the evaluation file (every `len(rows) // prompts`-th: the file
mixes levels), `--samples` team responses per prompt, one schedule, seed 0. Each side reports its seconds, the
tokens generated, the turns, the tokens fed and served from cache, the prefix cache entries left, and a hash of
every output: when the change is not meant to change outputs, the hashes agree.

    python benchmarks/handoff_eval.py --before /tmp/before --senior HF_DIR --junior HF_DIR --data eval.jsonl
        [--prompts 117 --samples 8 --schedule alternate --step-end '\\n' --max-new-tokens 480] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from before_after import add_arguments, machine_and_date, parse_or_run_child, run_side  # this script's folder

ROOT = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> dict:
    """One side: team rollouts with the project imported from this process's tree."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.methods.tandem.eval_axes import team_rollouts
    from slime_ext.tasks.templates import get_template
    from slime_ext.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.senior)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    rows = rows[:: max(len(rows) // args.prompts, 1)][: args.prompts]
    fmt = get_template(args.template)
    prompts = [tokenizer(fmt.format(r["prompt"]))["input_ids"] for r in rows]
    senior, junior = EmbeddedEngine.from_pretrained(args.senior), EmbeddedEngine.from_pretrained(args.junior)
    start = time.perf_counter()
    rollouts, cache = team_rollouts(senior, junior, prompts, args.samples, args.schedule, args.max_new_tokens,
                                    tokenizer.eos_token_id, seed=0, step_end=args.step_end)
    seconds = time.perf_counter() - start
    digest = hashlib.sha256(json.dumps([r.output_ids for r in rollouts]).encode()).hexdigest()[:16]
    return {"seconds": round(seconds, 2), "rollouts": len(rollouts),
            "generated_tokens": sum(len(r.output_ids) for r in rollouts),
            "turns_mean": round(sum(r.turns for r in rollouts) / len(rollouts), 3), **cache,
            "prefix_cache_entries": len(senior.prefix_cache) + len(junior.prefix_cache), "outputs_sha256": digest}


def _markdown(report: dict) -> str:
    lines = ["| side | commit | seconds | generated tokens | mean turns | cached share of fed tokens "
             "| prefix cache entries | outputs sha256 |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for side in ("before", "after"):
        r = report[side]
        lines.append(f"| {side} | {r['commit'][:7]}{' (dirty)' if r['dirty'] else ''} | {r['seconds']:.1f} "
                     f"| {r['generated_tokens']} | {r['turns_mean']:.2f} | {r['cached_token_share']:.3f} "
                     f"| {r['prefix_cache_entries']} | {r['outputs_sha256']} |")
    lines.append("")
    before, after = report["before"], report["after"]
    same = before["outputs_sha256"] == after["outputs_sha256"]
    lines.append(f"before / after seconds: **{before['seconds'] / after['seconds']:.2f}x**; "
                 f"outputs {'identical' if same else 'DIFFER'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senior", required=True, help="HF checkpoint directory of the senior")
    parser.add_argument("--junior", required=True, help="HF checkpoint directory of the junior (same tokenizer)")
    parser.add_argument("--data", required=True, help="evaluation JSONL with a `prompt` per row")
    parser.add_argument("--prompts", type=int, default=117)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--schedule", choices=["alternate", "bernoulli"], default="alternate")
    parser.add_argument("--step-end", default="\n", help="where a turn ends (task v2: a line)")
    parser.add_argument("--max-new-tokens", type=int, default=480)
    parser.add_argument("--template", default="plain")
    add_arguments(parser, ROOT)
    args = parse_or_run_child(parser, argv, child)
    if args is None:
        return 0
    passed = ["--senior", args.senior, "--junior", args.junior, "--data", args.data, "--prompts", str(args.prompts),
              "--samples", str(args.samples), "--schedule", args.schedule, "--step-end", args.step_end,
              "--max-new-tokens", str(args.max_new_tokens), "--template", args.template]
    report = {"workload": {k: getattr(args, k) for k in ("senior", "junior", "data", "prompts", "samples", "schedule",
                                                         "step_end", "max_new_tokens", "template", "threads")},
              **machine_and_date()}
    for side, tree in (("before", args.before), ("after", ROOT)):
        print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {side}: {tree}", file=sys.stderr, flush=True)
        report[side] = run_side(__file__, tree, passed, args.threads)
    table = _markdown(report)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"handoff_eval_{args.schedule}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"handoff_eval_{args.schedule}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
