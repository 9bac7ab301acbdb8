import json, glob, sys
TIMING = lambda k: k.startswith("time") or "seconds" in k or "per_s" in k or k.startswith("perf") or "rss" in k or "wall" in k
REF = "/work/main/results/refactor_identity_2026-11-26/after/{}.metrics.jsonl"
def rows_new(cfg):
    f = sorted(glob.glob(f"/tmp/ident29b_after2/runs/{cfg}/**/metrics.jsonl", recursive=True))
    return [json.loads(l) for l in open(f[-1]) if l.strip()] if f else None
out = []
for cfg in sys.argv[1:]:
    b = [json.loads(l) for l in open(REF.format(cfg)) if l.strip()]
    a = rows_new(cfg)
    if a is None:
        out.append(f"{cfg}: missing"); continue
    diffs, extra = [], set()
    for rb, ra in zip(b, a):
        keys = {k for k in set(rb) | set(ra) if not TIMING(k)}
        extra |= {k for k in keys if (k in rb) != (k in ra)}
        diffs += [(rb.get("step"), k, rb.get(k), ra.get(k)) for k in sorted(keys) if rb.get(k) != ra.get(k)]
    rew = [round(r.get("reward/mean", float("nan")), 3) for r in a]
    out.append(f"{cfg}: steps {len(b)}/{len(a)}, keys per row {len([k for k in b[0] if not TIMING(k)])}, differing {len(diffs)}, keys in one side only {sorted(extra)}, reward/mean {rew}" + (f" first diff {diffs[0]}" if diffs else ""))
print("\n".join(out))
