"""Two SFT runs' per-step metrics (`sft_metrics.jsonl`, plain or gzipped), compared step by step for bit-identity:
`python results/noise_floor_v2/compare_sft.py A B`. Prints the steps both have, the first step whose loss, gradient
norm, token count or learning rate differ (none if every shared step matches exactly), and the largest loss
difference."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slime_ext.studies.records import read_records  # any JSONL file, gzipped or not

KEYS = ("nll", "grad_norm", "tokens", "lr")


def compare(a: list[dict], b: list[dict]) -> dict:
    shared = min(len(a), len(b))
    first = next((a[i]["step"] for i in range(shared) if any(a[i][k] != b[i][k] for k in KEYS)), None)
    return {"steps_a": len(a), "steps_b": len(b), "steps_compared": shared, "first_differing_step": first,
            "max_abs_nll_difference": max((abs(a[i]["nll"] - b[i]["nll"]) for i in range(shared)), default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args()
    print(json.dumps(compare(read_records(args.a), read_records(args.b)), indent=2))


if __name__ == "__main__":
    main()
