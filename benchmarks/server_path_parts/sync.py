"""Weight-sync timing: `sync_weights` per method against a server, the RL step it is compared with (the
committed run's, or one measured by running the driver) and the sync's share of that step."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.server_path_parts.workload import ROOT

COMMITTED_METRICS = ROOT / "results/grpo_default/run_2026-11-21/metrics.jsonl"


def sync_times(pool: Any, named: list, repeats: int) -> dict[str, dict]:
    """sync_weights to the pool's server(s) with every method, the weights pushed from this process as one
    trainer rank would (`LocalWeightSource`); median of `repeats` after one warm-up (the distributed method's
    group is built in the warm-up, once per run as in the loop). push = the senders' buckets, commit = the
    driver's control messages (the disk index and load, or the version)."""
    from slime_ext.engine.weight_sync import LocalWeightSource

    out: dict[str, dict] = {}
    version = 100
    base_cfg = pool.cfg
    source = LocalWeightSource(named)
    for kind in ("disk", "tensor", "distributed"):
        pool.cfg = base_cfg.model_copy(update={"weight_sync": kind})
        t0 = time.perf_counter()
        pool.sync_weights(source, version)
        first = time.perf_counter() - t0
        version += 1
        rows = []
        for _ in range(repeats):
            rows.append(pool.sync_weights(source, version))
            version += 1
        commit = [r["time/sync_commit"] for r in rows]
        push = [r["time/sync_push"] for r in rows]
        total = [s + p for s, p in zip(commit, push)]
        out[kind] = {"commit_s": statistics.median(commit), "push_s": statistics.median(push),
                     "push_plus_commit_s": statistics.median(total), "first_sync_s": first,
                     "all_push_plus_commit_s": total}
        print(f"[bench] sync {kind}: push {out[kind]['push_s'] * 1e3:.1f} ms + commit "
              f"{out[kind]['commit_s'] * 1e3:.1f} ms (median of {repeats}; first {first * 1e3:.0f} ms)", flush=True)
    pool.cfg = base_cfg
    return out


def committed_step(path: Path) -> dict[str, Any]:
    """The median RL step of a committed run's metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    med = lambda k: statistics.median(r[k] for r in rows if k in r)  # noqa: E731
    return {"source": f"committed metrics of the default job: {path.relative_to(ROOT)} (median of {len(rows)} "
                      f"RL steps, trained model, natural EOS)",
            "time_step_s": med("time/step"), "time_rollout_s": med("time/rollout"), "time_train_s": med("time/train"),
            "time_sync_s": med("time/sync"), "time_sync_export_s": None,
            "response_len_mean": med("response_len/mean"), "steps": len(rows)}


def measured_step(workdir: Path, steps: int = 2) -> dict[str, Any]:
    """A fresh run of the default job (SFT 2 steps, `steps` RL steps, no evaluation); the last RL step's row."""
    out_dir, cache = workdir / "runs", workdir / "cache"
    argv = [sys.executable, "-m", "slime_ext.orchestration.driver", str(ROOT / "configs/grpo.yaml"), "sft.steps=2",
            f"train.steps={steps}", "run.stages=[data,tokenizer,sft,rl]", f"run.output_dir={out_dir}",
            f"run.cache_dir={cache}"]
    print("[bench] measuring the RL step:", " ".join(argv[1:]), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=str(ROOT), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the driver run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = sorted(out_dir.rglob("metrics.jsonl"))
    if not metrics:
        raise RuntimeError(f"no metrics.jsonl under {out_dir}")
    rows = [json.loads(line) for line in metrics[-1].read_text().splitlines() if line.strip()]
    row = rows[-1]
    return {"source": f"measured: `python -m slime_ext.orchestration.driver configs/grpo.yaml sft.steps=2 "
                      f"train.steps={steps} run.stages=[data,tokenizer,sft,rl] ...`, RL step {row['step']} "
                      f"(untrained model: responses run to the length limit)",
            "time_step_s": row["time/step"], "time_rollout_s": row["time/rollout"], "time_train_s": row["time/train"],
            "time_sync_s": row["time/sync"], "time_sync_export_s": row.get("time/sync_export"),
            "response_len_mean": row["response_len/mean"], "steps": len(rows),
            "all_rows": [{k: r[k] for k in ("step", "time/step", "time/rollout", "time/train", "time/sync",
                                            "time/sync_export") if k in r} for r in rows],
            "driver_wall_s": time.perf_counter() - t0}


def shares(step: dict[str, Any], sync: dict[str, dict], export: Optional[float] = None) -> dict[str, dict]:
    """Per method: the server path's sync in the loop (export + snapshot + push) and its share of a step whose
    embedded sync is replaced by it; plus the embedded engine's own share. `export`: the trainer's export
    time (measured); None: bounded by the embedded run's whole time/sync (export + Ray copy)."""
    export_used = export if export is not None else step["time_sync_s"]
    base = step["time_step_s"] - step["time_sync_s"]  # the step without its sync
    out = {"embedded": {"sync_s": step["time_sync_s"], "share": step["time_sync_s"] / step["time_step_s"]}}
    for kind, v in sync.items():
        total = export_used + v["push_plus_commit_s"]
        out[kind] = {"sync_s": total, "share": total / (base + total), "export_s": export_used,
                     "export_is_bound": export is None}
    return out
