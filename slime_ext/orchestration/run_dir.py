"""Run directories: one folder per run holding its resolved config, metrics, plots and checkpoints."""

from __future__ import annotations

import json
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


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically so an interrupted run never leaves a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
