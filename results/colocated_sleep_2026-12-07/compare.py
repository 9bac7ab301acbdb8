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


ARMS = ("sglang_colocated", "sglang_colocated_per_engine")
print("| evaluation | prompts | samples | " + " | ".join(f"{arm} identical to embedded" for arm in ARMS) + " |")
print("| --- | ---: | ---: | " + " | ".join("---" for _ in ARMS) + " |")
for name in ("warm_start", "final"):
    a = records("embedded", name)
    same = ["yes" if records(arm, name) == a else "NO" for arm in ARMS]
    print(f"| {name} | {len(a)} | {sum(len(r['scores']) for r in a)} | " + " | ".join(same) + " |")
print()
print("| step | reward embedded | reward colocated | reward per-engine | senders (colocated, per-engine) | "
      "engine/released_bytes MiB (2 engines) | memory/trainer_offloaded_bytes MiB (2 ranks) |")
print("| ---: | ---: | ---: | ---: | --- | ---: | ---: |")
for a, b, c in zip(rows("embedded"), rows("sglang_colocated"), rows("sglang_colocated_per_engine")):
    print(f"| {a['step']} | {a['reward/mean']:.4f} | {b['reward/mean']:.4f} | {c['reward/mean']:.4f} | "
          f"{b['sync/senders']:.0f}, {c['sync/senders']:.0f} | {b['engine/released_bytes'] / 2**20:.1f}, "
          f"{c['engine/released_bytes'] / 2**20:.1f} | {b['memory/trainer_offloaded_bytes'] / 2**20:.1f} |")
memory = json.loads((HERE / "sglang_colocated_per_engine" / "summary.json").read_text())["driver_memory"]
print()
print("Driver resident growth per stage (per-engine run, peak above the stage's start, MiB): "
      + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in memory["stage_growth_bytes"].items())
      + f"; peak {memory['peak_rss_bytes'] / 2**20:.0f}")
