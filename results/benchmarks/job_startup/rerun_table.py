"""Per-module seconds of one suite run beside re-runs of the same tests minutes later (same commit, same machine),
from pytest's JUnit XML files: `python rerun_table.py --suite SUITE.xml --rerun NAME=RERUN.xml ... [--csv OUT]`.
Shows how far one machine's speed moves within a session (what a single suite time can and cannot tell)."""

from __future__ import annotations

import argparse
import csv
import xml.etree.ElementTree as ET
from collections import defaultdict


def test_seconds(path: str) -> dict[str, float]:
    return {f"{c.get('classname')}::{c.get('name')}": float(c.get("time")) for c in ET.parse(path).iter("testcase")}


def module_of(test: str) -> str:
    parts = test.split("::")[0].split(".")
    return ".".join(parts[:-1] if parts[-1][:1].isupper() else parts)  # drop a test class name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--rerun", nargs="+", required=True, metavar="NAME=XML")
    parser.add_argument("--csv")
    args = parser.parse_args()
    suite = test_seconds(args.suite)
    reruns = {name: test_seconds(path) for name, path in (r.split("=", 1) for r in args.rerun)}
    rows = []
    for name, rerun in reruns.items():
        by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for test, seconds in rerun.items():
            if test in suite:
                by_module[module_of(test)][0] += suite[test]
                by_module[module_of(test)][1] += seconds
                rows.append((name, test, suite[test], seconds))
        print(f"\n### {name}\n\n| module | suite run (s) | re-run (s) | ratio |\n| --- | ---: | ---: | ---: |")
        for module, (a, b) in sorted(by_module.items(), key=lambda kv: -kv[1][0]):
            if a >= 3.0:
                print(f"| `{module}` | {a:.1f} | {b:.1f} | {b / a:.2f} |")
        a, b = sum(v[0] for v in by_module.values()), sum(v[1] for v in by_module.values())
        print(f"| **all {sum(t in suite for t in rerun)} tests** | **{a:.1f}** | **{b:.1f}** | **{b / a:.2f}** |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["rerun", "test", "suite_seconds", "rerun_seconds"])
            w.writerows((n, t, f"{a:.3f}", f"{b:.3f}") for n, t, a, b in rows)


if __name__ == "__main__":
    main()
