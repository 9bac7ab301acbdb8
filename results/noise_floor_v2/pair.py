"""Two evaluations' per-prompt records paired over the prompts both hold: mean@n of each and A - B (mean difference
± SE over prompts, normal 95% interval), as JSON:
`python results/noise_floor_v2/pair.py A.records.jsonl.gz B.records.jsonl.gz` (e.g. one run at two checkpoints
sampled at the same temperature)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from slime_ext.studies import ci_text, paired_over_prompts, per_prompt_scores, read_records


def pair(a: Path, b: Path) -> dict:
    sa, sb = per_prompt_scores(read_records(a)), per_prompt_scores(read_records(b))
    diff = paired_over_prompts(sa, sb)
    return {"a": str(a), "b": str(b), "mean_a": float(np.mean(list(sa.values()))),
            "mean_b": float(np.mean(list(sb.values()))), "a_minus_b": diff, "text": ci_text(diff)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args()
    print(json.dumps(pair(args.a, args.b), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
