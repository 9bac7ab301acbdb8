"""Shared plumbing of the study scripts (`scripts/*_study.py`): resumable runs, mean/spread tables.

A study is a grid of main-job runs (config x seed), each in its own output folder; a run that already
finished (its `summary.json` says complete) is not run again, so an interrupted study resumes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]


def finished_run(parent: Path) -> Optional[Path]:
    for run in sorted(parent.glob("*/summary.json"), reverse=True):
        if json.loads(run.read_text()).get("complete"):
            return run.parent
    return None


def run_one(config: str, seed: int, parent: Path, overrides: Sequence[str], shared_sft_seed: int = 0) -> Path:
    """One main-job run (resumed study: skipped when already complete); returns its run directory."""
    done = finished_run(parent)
    if done is not None:
        print(f"[study] {config} seed {seed}: done earlier ({done})", flush=True)
        return done
    cmd = [sys.executable, "-m", "slime_ext.orchestration.driver", str(REPO / "configs" / config), f"run.seed={seed}",
           f"sft.seed={shared_sft_seed}", f"run.output_dir={parent}", *overrides]
    print(f"[study] {' '.join(cmd)}", flush=True)
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    subprocess.run(cmd, cwd=REPO, check=True, env=env)
    run = finished_run(parent)
    if run is None:
        raise RuntimeError(f"{config} seed {seed}: the run ended without a complete summary under {parent}")
    return run


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def summarise(rows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per method and key: (mean, std over seeds, number of seeds)."""
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for method, runs in rows.items():
        out[method] = {}
        for k in sorted({k for r in runs for k in r}):
            vals = [r[k] for r in runs if k in r]
            out[method][k] = (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals))
    return out


def write_table(out: Path, title: str, summary: dict, runs: dict[str, list[str]], seeds: Sequence[int],
                command: str, keys: Optional[list[str]] = None) -> str:
    """`table.json` and `table.md` (mean ± std over seeds) under `out`; returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"summary": summary, "runs": runs, "seeds": list(seeds)}, indent=2) + "\n")
    keys = keys or sorted({k for stats in summary.values() for k in stats})
    lines = ["| method | " + " | ".join(keys) + " |", "| --- | " + " | ".join("---" for _ in keys) + " |"]
    for method, stats in summary.items():
        cells = [f"{stats[k][0]:.3f} ± {stats[k][1]:.3f}" if k in stats else "-" for k in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    meta = (f"command: `{command}`  \nseeds: {list(seeds)} (mean ± std over seeds)  \n"
            f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}, machine: {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs")
    table = "\n".join(lines)
    (out / "table.md").write_text(f"# {title}\n\n{meta}\n\n{table}\n")
    return table
