"""The colocated sleeping run against the embedded run: per-prompt records, per-step rewards, and the sleep metrics.

    python results/colocated_sleep_2026-12-07/compare.py > results/colocated_sleep_2026-12-07/compare.md
"""

import json
from pathlib import Path

HERE = Path(__file__).parent


def records(arm: str, name: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / arm / f"eval_{name}.records.jsonl").read_text().splitlines()]


def rows(arm: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / arm / "metrics.jsonl").read_text().splitlines()]


print("| evaluation | prompts | samples | identical records (scores, lengths, finish reasons) |")
print("| --- | ---: | ---: | --- |")
for name in ("warm_start", "final"):
    a, b = records("embedded", name), records("sglang_colocated", name)
    same = a == b
    print(f"| {name} | {len(a)} | {sum(len(r['scores']) for r in a)} | {'yes' if same else 'NO'} |")
print()
print("| step | reward embedded | reward colocated | engine/released_bytes (MiB, 2 engines) | "
      "memory/trainer_offloaded_bytes (MiB, 2 ranks) | time/engine_sleep (s) |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for a, b in zip(rows("embedded"), rows("sglang_colocated")):
    print(f"| {a['step']} | {a['reward/mean']:.4f} | {b['reward/mean']:.4f} | {b['engine/released_bytes'] / 2**20:.1f} | "
          f"{b['memory/trainer_offloaded_bytes'] / 2**20:.1f} | {b['time/engine_sleep']:.2f} |")
