"""Per-level accuracy and length of an evaluation report's per-prompt records (task family v2 calibration).

    python results/task_v2_pilot/per_level.py RUN_DIR/eval_final.records.jsonl [--out table.md]

mean@1 per level is the mean over the level's prompts of each prompt's mean score over its samples, with the
standard error over prompts; greedy is the greedy sample's accuracy; lengths are generated tokens per sample.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: slime_ext
from slime_ext.studies import per_level_table, read_records  # noqa: E402


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
    rows = per_level_table(records)
    md = to_markdown(rows, len(records[0]["scores"]))
    print(md)
    if args.out:
        args.out.write_text(md + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
