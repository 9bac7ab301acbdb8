"""Run directories: one folder per run holding its resolved config, metrics, plots and checkpoints."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from slime_ext.config import ResolvedConfig


def create_run_dir(resolved: ResolvedConfig) -> Path:
    """A fresh `output_dir/<name>-<timestamp>` (suffixed if taken), with the resolved config written."""
    cfg = resolved.config
    if cfg.run.resume:
        run_dir = Path(cfg.run.resume)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"run.resume={run_dir}: not a run directory (no config.yaml in it)")
        return run_dir
    base = Path(cfg.run.output_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    run_dir.mkdir(parents=True)
    resolved.write(run_dir)
    return run_dir


UNUSED_RUN_FILES = {"config.yaml", "summary.json", "summary.json.tmp"}


def remove_if_unused(run_dir: Path) -> bool:
    """Delete a run directory that holds nothing but its config and summary (a run that failed before it
    produced anything); True when it was removed. A directory with any other file is kept."""
    if not run_dir.is_dir() or any(p.name not in UNUSED_RUN_FILES for p in run_dir.iterdir()):
        return False
    shutil.rmtree(run_dir)
    return True


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically so an interrupted run never leaves a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
