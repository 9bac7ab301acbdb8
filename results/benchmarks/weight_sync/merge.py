"""The after rows: the full run (f74bae5) for every case but 560M tp2ep2, whose run hung once in a weight-group
setup (the fix that followed turns such a failure into an error); that case measured again in two runs of the same
code plus the fix (distributed + delta, then disk + tensor)."""
import json
full = json.load(open("/tmp/wsbench/final/weight_sync_after.json"))
parts = [json.load(open(f"/tmp/wsbench/{d}/weight_sync_after.json")) for d in ("final2", "final3")]
rows = [r for r in full["rows"] if not (r["size"] == "560M" and r["layout"] == "tp2ep2")]
for p in parts:
    rows += p["rows"]
full["rows"] = rows
full["errors"] = [e for e in full["errors"] if not (e["size"] == "560M" and e["layout"] == "tp2ep2")]
full["note"] = __doc__
full["parts"] = [{"command": p["command"], "date": p["date"], "commit": p["commit"]} for p in parts]
json.dump(full, open("/tmp/wsbench/final/weight_sync_after_merged.json", "w"), indent=1)
print(len(rows), "rows")
