"""Per-level accuracy and length of an evaluation report's per-prompt records (task family v2 calibration).

    python results/task_v2_pilot/per_level.py RUN_DIR/eval_final.records.jsonl [--out table.md]

mean@1 per level is the mean over the level's prompts of each prompt's mean score over its samples, with the
standard error over prompts; greedy is the greedy sample's accuracy; lengths are generated tokens per sample.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

import numpy as np


def read_records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def level_key(level: str) -> tuple:
    m = re.fullmatch(r"([A-Z]+)(\d+)", level or "")
    return (m.group(1), int(m.group(2))) if m else (str(level), 0)


def table(records: list[dict]) -> list[dict]:
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r.get("level") or "?", []).append(r)
    rows = []
    for level in sorted(by, key=level_key):
        rs = by[level]
        per_prompt = np.array([np.mean(r["scores"]) for r in rs])
        lengths = np.array([n for r in rs for n in r["lengths"]])
        greedy = [r["greedy_score"] for r in rs if r.get("greedy_score") is not None]
        truncated = np.mean([f == "length" for r in rs for f in r["finish_reasons"]])
        rows.append({"level": level, "n_prompts": len(rs), "mean@1": float(per_prompt.mean()),
                     "mean@1_se": float(per_prompt.std(ddof=1) / np.sqrt(len(rs))) if len(rs) > 1 else None,
                     "pass@k": float(np.mean([max(r["scores"]) for r in rs])),
                     "greedy": float(np.mean(greedy)) if greedy else None,
                     "mean_len": float(lengths.mean()), "max_len": int(lengths.max()),
                     "truncated": float(truncated)})
    return rows


def to_markdown(rows: list[dict], k: int) -> str:
    out = [f"| level | prompts | mean@1 ± SE | pass@{k} | greedy | mean / max tokens | truncated |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        se = "" if r["mean@1_se"] is None else f" ± {100 * r['mean@1_se']:.1f}"
        greedy = "-" if r["greedy"] is None else f"{100 * r['greedy']:.1f}"
        out.append(f"| {r['level']} | {r['n_prompts']} | {100 * r['mean@1']:.1f}{se} | {100 * r['pass@k']:.1f} | "
                   f"{greedy} | {r['mean_len']:.0f} / {r['max_len']} | {100 * r['truncated']:.1f}% |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    records = read_records(args.records)
    rows = table(records)
    md = to_markdown(rows, len(records[0]["scores"]))
    print(md)
    if args.out:
        args.out.write_text(md + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
