"""Materialise a run's train/eval datasets from its config, cached so re-runs are instant.

Synthetic data is written as JSONL under the cache (keyed by a hash of what determines it) and then
read back through the same loader a user's JSONL file goes through, so both paths share one code path.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from slime_ext.config.sections import DataConfig, SyntheticDataConfig
from slime_ext.tasks.dataset import DatasetError, LoadReport, load_jsonl
from slime_ext.tasks.synthetic_math import generate_dataset, write_jsonl
from slime_ext.tasks.tool_solutions import with_tool_solution

logger = logging.getLogger(__name__)
SYNTHETIC_FORMAT = "synthetic_math-v1"  # bump when the generator's output changes
# Task family v2's own version, in the key only of data sets with v2 levels (v1 keys stay as they were): bump
# when slime_ext/tasks/v2 changes its output.
TASK_V2_FORMAT = "task_v2-1"


@dataclass
class PreparedData:
    train: list[dict]
    eval: list[dict]
    train_path: Path
    eval_path: Path | None
    reports: list[LoadReport]


RowTransform = Callable[[dict], dict]


def transform_key(row_transform: Optional[RowTransform]) -> Optional[str]:
    """What identifies a row transform in cache keys (the prepared data's, the SFT warm start's): its
    `cache_key` attribute when it has one, else its import path; None without a transform."""
    if row_transform is None:
        return None
    return getattr(row_transform, "cache_key", None) or f"{row_transform.__module__}:{row_transform.__qualname__}"


def rewrite_synthetic_rows(rows: list[dict], syn: SyntheticDataConfig, row_transform: Optional[RowTransform] = None) -> list[dict]:
    """The generator's rows (steps joined by "\\n") as a run's data stage writes them: the method's row transform,
    else one tool call per solution (`solution_tool`), else the steps joined by `step_separator`. One place, so every
    reader of the prepared format (the data stage, the reference-length measurement) rewrites rows alike."""
    if row_transform is not None:
        return [row_transform(r) for r in rows]
    if syn.solution_tool is not None:  # one tool call instead of the steps (tasks/tool_solutions.py)
        return [with_tool_solution(r, syn.solution_tool) for r in rows]
    if syn.step_separator != "\n":
        return [dict(r, solution=r["solution"].replace("\n", syn.step_separator)) for r in rows]
    return rows


def _synthetic_paths(cfg: DataConfig, cache_dir: Path, row_transform: Optional[RowTransform]) -> tuple[Path, Path]:
    syn = cfg.synthetic
    if syn.solution_tool is not None and row_transform is not None:
        raise ValueError(f"data.synthetic.solution_tool = {syn.solution_tool!r} and the method's row transform "
                         f"{transform_key(row_transform)} both rewrite the reference solutions; use one")
    parts = [SYNTHETIC_FORMAT, syn.cache_fields(), transform_key(row_transform)]
    if syn.v2_levels():
        parts.append(TASK_V2_FORMAT)
    key = json.dumps(parts, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = cache_dir / "data" / f"synthetic-{digest}"
    train, evals = folder / "train.jsonl", folder / "eval.jsonl"
    if not (train.is_file() and evals.is_file()):
        logger.info("generating synthetic math data into %s", folder)
        for levels, n, split, path, weights in ((syn.eval_levels, syn.n_eval, "eval", evals, None),
                                                (syn.train_levels, syn.n_train, "train", train,
                                                 syn.train_level_weights)):
            rows = generate_dataset(levels, n, syn.seed, split, recheck_share=syn.recheck_share_value(),
                                    level_weights=weights)
            write_jsonl(rewrite_synthetic_rows(rows, syn, row_transform), path)
    return train, evals


def prepare_data(cfg: DataConfig, cache_dir: str | Path, row_transform: Optional[RowTransform] = None) -> PreparedData:
    """Train and eval rows for a run. JSONL without an eval file holds out the last 5% (<= 256 rows).
    `row_transform` rewrites every synthetic row, in place of `step_separator` (the configured method's section
    supplies it, `slime_ext.methods.registry.data_transform(config)`: the data layer knows no method)."""
    if cfg.source == "synthetic_math":
        train_path, eval_path = _synthetic_paths(cfg, Path(cache_dir), row_transform)
        keys = {"prompt_key": "prompt", "label_key": "label"}
    else:
        train_path = Path(cfg.train_path)
        eval_path = Path(cfg.eval_path) if cfg.eval_path else None
        keys = {"prompt_key": cfg.prompt_key, "label_key": cfg.label_key}
    train, train_report = load_jsonl(train_path, max_bad_fraction=cfg.max_bad_fraction, **keys)
    reports = [train_report]
    if eval_path is not None:
        evals, eval_report = load_jsonl(eval_path, max_bad_fraction=cfg.max_bad_fraction, **keys)
        reports.append(eval_report)
    else:
        n_hold = min(256, max(1, len(train) // 20))
        if len(train) < 2:
            raise DatasetError(f"{train_path}: need at least 2 valid rows to hold out an eval set (set data.eval_path)")
        train, evals = train[:-n_hold], train[-n_hold:]
        logger.warning("data.eval_path not set: holding out the last %d rows of %s for evaluation", n_hold, train_path)
    return PreparedData(train=train, eval=evals, train_path=train_path, eval_path=eval_path, reports=reports)
