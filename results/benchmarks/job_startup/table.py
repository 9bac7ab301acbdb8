"""Per-test call times of the side-by-side runs (pytest --durations=0 logs) as one markdown table."""
import re, sys, json
from pathlib import Path
def load(f):
    d = {}
    for l in Path(f).read_text().splitlines():
        m = re.match(r"\s*([\d.]+)s (call)\s+(\S+)", l)
        if m and float(m.group(1)) > 1.0:
            d[m.group(3)] = float(m.group(1))
    total = re.search(r"in ([\d.]+)s", Path(f).read_text().splitlines()[-1]).group(1)
    return d, float(total)
cols = [a.split("=", 1) for a in sys.argv[1:]]
data = {name: load(f) for name, f in cols}
tests = sorted({t for d, _ in data.values() for t in d}, key=lambda t: -max(d.get(t, 0) for d, _ in data.values()))
print("| test | " + " | ".join(n for n, _ in cols) + " |")
print("| --- | " + " | ".join("---:" for _ in cols) + " |")
for t in tests:
    print(f"| `{t.split('::', 1)[1]}` | " + " | ".join(f"{data[n][0].get(t, float('nan')):.1f}" for n, _ in cols) + " |")
print("| **module, pytest's total** | " + " | ".join(f"**{data[n][1]:.1f}**" for n, _ in cols) + " |")
