"""Two runs' per-step metrics, compared step by step for bit-identity: `python results/noise_floor_v2/compare_sft.py
A B` for two SFT runs (`sft_metrics.jsonl`, plain or gzipped): the steps both have, the first step whose loss,
gradient norm, token count or learning rate differ (none if every shared step matches exactly), and the largest loss
difference. `--rl` for two RL runs (`metrics.jsonl`): every metric except timings (time/, perf/, memory/) over the
steps both have, and the keys that differ anywhere (a longer run's first steps against a shorter run's)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slime_ext.studies.records import read_records  # any JSONL file, gzipped or not

KEYS = ("nll", "grad_norm", "tokens", "lr")
TIMING_PREFIXES = ("time/", "perf/", "memory/")


def compare(a: list[dict], b: list[dict]) -> dict:
    shared = min(len(a), len(b))
    first = next((a[i]["step"] for i in range(shared) if any(a[i][k] != b[i][k] for k in KEYS)), None)
    return {"steps_a": len(a), "steps_b": len(b), "steps_compared": shared, "first_differing_step": first,
            "max_abs_nll_difference": max((abs(a[i]["nll"] - b[i]["nll"]) for i in range(shared)), default=0.0)}


def compare_rl(a: list[dict], b: list[dict]) -> dict:
    """Every non-timing metric both runs log, over the steps both have."""
    shared = min(len(a), len(b))
    keys = sorted(k for k in set(a[0]) & set(b[0]) if not k.startswith(TIMING_PREFIXES)) if shared else []
    differing = sorted({k for i in range(shared) for k in keys if a[i].get(k) != b[i].get(k)})
    first = next((i for i in range(shared) if any(a[i].get(k) != b[i].get(k) for k in keys)), None)
    return {"steps_a": len(a), "steps_b": len(b), "steps_compared": shared, "keys_compared": len(keys),
            "excluded_prefixes": list(TIMING_PREFIXES), "first_differing_row": first, "differing": differing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--rl", action="store_true", help="RL metrics.jsonl: every non-timing key")
    args = parser.parse_args()
    a, b = read_records(args.a), read_records(args.b)
    print(json.dumps(compare_rl(a, b) if args.rl else compare(a, b), indent=2))


if __name__ == "__main__":
    main()
