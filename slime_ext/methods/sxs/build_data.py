"""Build SxS interleaved training data: `python -m slime_ext.methods.sxs.build_data --input triples.jsonl --out data.jsonl`.

Input rows: {"id", "question", "reasoning", "answer"} (+ "label", and "requires" for the rule oracle);
`--synthetic N` makes N triples from the synthetic math task instead. Oracles: `--oracle rule` (needs
"requires") or `--oracle judge --judge-url URL` (any OpenAI-compatible endpoint, e.g.
`python -m slime_ext.tools.serve`; answers cached in `--cache`, default OUT.judge_cache.jsonl). Prefix checks
run concurrently (`--concurrency`); an interrupted build resumes. Writes OUT and OUT.report.json
(examples, oracle checks made vs the sequential count, failures). Exit 2 on unusable input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger("slime_ext.methods.sxs.build_data")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from slime_ext.methods.sxs.builder import build
    from slime_ext.methods.sxs.oracles import JudgeOracle, RuleOracle

    ap = argparse.ArgumentParser(prog="python -m slime_ext.methods.sxs.build_data", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="JSONL of (id, question, reasoning, answer) triples")
    src.add_argument("--synthetic", type=int, help="make this many triples from the synthetic math task")
    ap.add_argument("--level", default="L2", help="synthetic math level (with --synthetic)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--oracle", choices=["rule", "judge"], default="rule")
    ap.add_argument("--judge-url", help="OpenAI-compatible base URL (with --oracle judge)")
    ap.add_argument("--judge-model", default="default")
    ap.add_argument("--judge-timeout", type=float, default=60.0)
    ap.add_argument("--cache", help="judge answer cache (JSONL); default OUT.judge_cache.jsonl")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    out = Path(args.out)
    try:
        if args.synthetic:
            from slime_ext.methods.sxs.synthetic import synthetic_triples
            from slime_ext.tasks.synthetic_math import generate_dataset

            examples = synthetic_triples(generate_dataset([args.level], args.synthetic, args.seed, "train"))
        else:
            examples = []
            for i, line in enumerate(Path(args.input).read_text().splitlines()):
                if line.strip():
                    try:
                        examples.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{args.input}: row {i + 1} is not JSON ({exc})") from None
        if args.oracle == "judge":
            if not args.judge_url:
                raise ValueError("--oracle judge needs --judge-url")
            from slime_ext.clients.openai_client import OpenAIClient

            client = OpenAIClient(args.judge_url, model=args.judge_model, timeout_s=args.judge_timeout,
                                  max_concurrency=args.concurrency)
            oracle = JudgeOracle(client, args.cache or str(out) + ".judge_cache.jsonl")
        else:
            oracle = RuleOracle()
        report = build(examples, oracle, out, args.concurrency,
                       progress=lambda n: n % 100 == 0 and log.info("%d examples built", n))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = report.to_dict()
    Path(str(out) + ".report.json").write_text(json.dumps(data, indent=2) + "\n")
    log.info("built %d examples (%d already done), %d oracle checks (sequential: %d), %d failures -> %s",
             report.examples, report.skipped_done, report.checks_made, report.checks_sequential,
             len(report.failures), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
