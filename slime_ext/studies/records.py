"""Per-prompt evaluation records (`eval_*.records.jsonl[.gz]`, written by `slime_ext.evaluation`) as tables, and a
run's per-step metrics (`metrics.jsonl`)."""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

log = logging.getLogger("slime_ext.studies")

__all__ = ["RUN_FILES", "read_records", "read_metrics", "per_prompt_scores", "level_key", "per_level_table",
           "keep_run_files"]


def read_records(path: Path | str) -> list[dict]:
    """The records of one evaluation, gzipped or not; a missing `x.records.jsonl` is read from `x.records.jsonl.gz`
    beside it (how a study keeps a run's records under `results/`)."""
    path = Path(path)
    if not path.exists() and path.suffix != ".gz":
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def per_prompt_scores(records: list[dict], level: str | None = None) -> dict[str, float]:
    """Each prompt's mean score over its samples, by prompt id (optionally one level's prompts only)."""
    return {r["prompt_id"]: float(np.mean(r["scores"])) for r in records
            if level is None or r.get("level") == level}


def level_key(level: str) -> tuple:
    """Sort key putting V2 before V10 (letters, then the number)."""
    m = re.fullmatch(r"([A-Z]+)(\d+)", level or "")
    return (m.group(1), int(m.group(2))) if m else (str(level), 0)


def per_level_table(records: list[dict]) -> list[dict]:
    """Per level: prompts, mean@1 (mean over prompts of each prompt's mean over samples) with its standard error
    over prompts, pass@k (k = samples per prompt), greedy accuracy, generated tokens per sample (mean, max) and
    the share of samples cut at the length limit."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r.get("level") or "?", []).append(r)
    rows = []
    for level in sorted(by, key=level_key):
        rs = by[level]
        scores = np.array([np.mean(r["scores"]) for r in rs])
        lengths = np.array([n for r in rs for n in r["lengths"]])
        greedy = [r["greedy_score"] for r in rs if r.get("greedy_score") is not None]
        rows.append({"level": level, "n_prompts": len(rs), "mean@1": float(scores.mean()),
                     "mean@1_se": float(scores.std(ddof=1) / np.sqrt(len(rs))) if len(rs) > 1 else None,
                     "pass@k": float(np.mean([max(r["scores"]) for r in rs])),
                     "greedy": float(np.mean(greedy)) if greedy else None,
                     "mean_len": float(lengths.mean()), "max_len": int(lengths.max()),
                     "truncated": float(np.mean([f == "length" for r in rs for f in r["finish_reasons"]]))})
    return rows


# What a study keeps of a run directory: small files; per-prompt records go in gzipped (checkpoints do not).
RUN_FILES = ("config.yaml", "summary.json", "metrics.jsonl", "eval_warm_start.json", "eval_final.json",
             "eval_sft.json", "final_table.md")


def read_metrics(path: Path | str) -> list[dict]:
    """A run's `metrics.jsonl` (give the run directory or the file), one dict per RL step: the one reader of the
    plots, the study scripts and the tests. A line that is not a JSON object (a run stopped mid-write) is skipped
    with a warning naming it; a record without a numeric `step` takes its position among the valid ones."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records: list[dict] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                log.warning("%s:%d: skipped, not valid JSON (%s)", path, line_no, exc.msg)
                continue
            if not isinstance(obj, dict):
                log.warning("%s:%d: skipped, not a JSON object (%s)", path, line_no, type(obj).__name__)
                continue
            step = obj.get("step")
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
                obj = {**obj, "step": len(records)}
            records.append(obj)
    return records


def keep_run_files(run: Path | str, dest: Path | str, names: tuple[str, ...] = RUN_FILES) -> None:
    """Copy a run's small files (`names`, those that exist) and its evaluation records, gzipped, into `dest`:
    what a study commits under `results/`. A run read from its kept copy (`dest` itself) is left as it is."""
    run, dest = Path(run), Path(dest)
    if run.resolve() == dest.resolve():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (run / name).is_file():
            shutil.copyfile(run / name, dest / name)
    for report in run.glob("eval_step*.json"):  # the evaluations between steps (eval.every)
        shutil.copyfile(report, dest / report.name)
    for rec in run.glob("eval_*.records.jsonl"):
        kept = dest / (rec.name + ".gz")
        if kept.is_file() and _gunzipped(kept) == rec.read_bytes():
            continue  # re-gzipping would stamp a new time in the header: an unchanged record would show as changed
        with open(rec, "rb") as src, gzip.open(kept, "wb") as dst:
            shutil.copyfileobj(src, dst)


def _gunzipped(path: Path) -> bytes | None:
    """A kept file's content, None where it is not a readable gzip (then it is written again)."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError):
        return None


def _kept_problem(folder: Path, needs: str) -> Optional[str]:
    """Why `folder` is not a finished kept run (None: it is one)."""
    if not (folder / needs).is_file():
        return f"{folder / needs} is missing (that run has not finished or was not kept)"
    if needs == "summary.json" and not json.loads((folder / needs).read_text()).get("complete"):
        return f"{folder / needs} is not marked complete (the run stopped part-way)"
    return None


def kept_copy(out: Path, name: str, needs: str = "summary.json") -> Optional[Path]:
    """A finished run as the study kept it under `out/runs/` (its small files and gzipped records), or None. The
    study reads it instead of running again, so the table over seeds can be built on a machine that holds only
    `results/` (every session may start on a fresh one)."""
    folder = out / "runs" / name
    return None if _kept_problem(folder, needs) else folder


def kept_run(out: Path, name: str, needs: str = "summary.json") -> Path:
    """`kept_copy`, required (`--report-only`): a missing or unfinished one is an error naming it."""
    folder = out / "runs" / name
    problem = _kept_problem(folder, needs)
    if problem:
        raise SystemExit(f"--report-only: {problem}")
    return folder
