"""Run directories: one folder per run holding its resolved config, metrics, plots and checkpoints."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Optional

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


ENGINE_EVENTS_FILE = "engine_events.jsonl"


def append_engine_events(run_dir: Path, events: list[dict[str, Any]]) -> None:
    """Append engine restart events (one JSON line each: time, step, engine, url, restart, max_restarts,
    reason, resent_requests) to `<run dir>/engine_events.jsonl`: the record of a run's engine faults that
    otherwise lived only in a Ray worker's log. Never truncated on resume: the events did happen."""
    if not events:
        return
    with (Path(run_dir) / ENGINE_EVENTS_FILE).open("a") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def engine_event_line(event: dict[str, Any]) -> str:
    """The console line of one restart, e.g. "[step 3] engine 0 restarted (1/2): its server process died;
    64 request(s) re-sent"."""
    line = (f"[step {event.get('step', '?')}] engine {event['engine']} restarted "
            f"({event['restart']}/{event['max_restarts']}): {event['reason']}")
    if "resent_requests" in event:
        line += f"; {event['resent_requests']} request(s) re-sent"
    return line


# -- resume -----------------------------------------------------------------------------------------
PEAK_RSS_KEY = "memory/peak_rss_gib"


def resume_command(run_dir: Path) -> str:
    return f"bash scripts/run.sh resume={run_dir}"


class RunStopped(RuntimeError):
    """The run stopped on a failure it survives on disk (a Ray actor died, Ray's memory monitor killed a
    worker): the message names what was running, the last intact checkpoint and the resume command. The
    driver prints it without a traceback and exits non-zero."""


def truncate_metrics(path: Path, before_step: int) -> None:
    """Keep only the rows of steps before `before_step` (the step a resumed run starts at, 0 when no
    checkpoint was written), so the resumed rows continue the kept ones without duplicates. Unparsable
    lines (a row cut by the kill) are dropped."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("step", -1) < before_step:
            keep.append(line)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(k + "\n" for k in keep))
    tmp.replace(path)


def peak_rss_from_metrics(path: Path) -> Optional[float]:
    """The largest peak RSS the metrics rows recorded (None when no row measured it): a resumed run
    starts its peak from the steps it kept instead of from 0."""
    if not path.exists():
        return None
    peaks = []
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line).get(PEAK_RSS_KEY)
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, (int, float)) and value > 0:
            peaks.append(float(value))
    return max(peaks) if peaks else None


def finished_run_message(run_dir: Path) -> Optional[str]:
    """What to tell a user who resumes a run whose `summary.json` says complete (None if it is not):
    there is nothing to resume, and re-running the evaluation would overwrite its results."""
    summary = run_dir / "summary.json"
    try:
        complete = json.loads(summary.read_text()).get("complete") is True
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if not complete:
        return None
    results = " and ".join(str(run_dir / name) for name in ("summary.json", "final_table.md") if (run_dir / name).exists())
    return (f"run already finished: {run_dir} (summary.json says complete); nothing to resume and nothing was "
            f"changed. Its results are in {results}. Evaluate its weights again with "
            f"`python -m slime_ext.tools.eval_checkpoint {run_dir}`; to train further, start a new run")
