"""Per-prompt evaluations and per-step metrics of grpo_quick through two engine servers: the commit before
the sync from the trainer ranks (disk) against this change with each sync path."""
import json, sys
from pathlib import Path

runs = {name: next(Path(f"/tmp/gq/{name}/runs").iterdir()) for name in ("before", "disk", "tensor", "distributed") if Path(f"/tmp/gq/{name}/runs").is_dir() and (next(Path(f"/tmp/gq/{name}/runs").iterdir()) / "eval_final.json").exists()}

def records(run, which):
    return [json.loads(l) for l in (run / f"eval_{which}.records.jsonl").read_text().splitlines() if l.strip()]

def metrics(run):
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]

ref = runs["before"]
print("| run | warm-start records equal to before | final records equal to before | steps with equal reward/mean and response_len/mean | rollout versions = step | time/sync median s | final mean@4 |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, run in runs.items():
    out = []
    for which in ("warm_start", "final"):
        a, b = records(ref, which), records(run, which)
        same = sum(x == y for x, y in zip(a, b))
        out.append(f"{same}/{len(a)}")
    ma, mb = metrics(ref), metrics(run)
    steps = sum(x["reward/mean"] == y["reward/mean"] and x["response_len/mean"] == y["response_len/mean"] for x, y in zip(ma, mb))
    versions = all(r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == r["step"] for r in mb)
    syncs = sorted(r["time/sync"] for r in mb)
    table = json.loads((run / "eval_final.json").read_text())
    mean4 = round(100 * table["mean@4"], 1)
    print(f"| {name} ({run.name}) | {out[0]} | {out[1]} | {steps}/{len(ma)} | {versions} | {syncs[len(syncs)//2]:.3f} | {mean4} |")
