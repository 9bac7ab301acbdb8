import json, glob, sys
TIMING = lambda k: k.startswith("time") or "seconds" in k or "per_s" in k or k.startswith("perf") or "rss" in k or "wall" in k
def rows(side, cfg):
    f = sorted(glob.glob(f"/tmp/ident29_{side}/runs/{cfg}/**/metrics.jsonl", recursive=True))
    return [json.loads(l) for l in open(f[-1]) if l.strip()] if f else None
out = []
for cfg in sys.argv[1:]:
    b, a = rows("before", cfg), rows("after", cfg)
    if b is None or a is None:
        out.append(f"{cfg}: missing ({'before' if b is None else 'after'})"); continue
    diffs = []
    for rb, ra in zip(b, a):
        keys = {k for k in set(rb) | set(ra) if not TIMING(k)}
        diffs += [(rb.get("step"), k, rb.get(k), ra.get(k)) for k in sorted(keys) if rb.get(k) != ra.get(k)]
    rew = [round(r.get("reward/mean", float("nan")), 3) for r in b]
    out.append(f"{cfg}: steps {len(b)}/{len(a)}, compared keys per row {len([k for k in b[0] if not TIMING(k)])}, differing {len(diffs)}, reward/mean {rew}" + (f" first diff {diffs[0]}" if diffs else ""))
print("\n".join(out))
