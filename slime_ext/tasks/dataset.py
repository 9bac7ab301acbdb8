"""Tolerant, lazily read JSONL prompt/label datasets.

Why: real RL prompt files are large and dirty (a truncated last line, a stray
list, a row missing its answer, a few bytes of mojibake). One bad row must not
kill a multi-hour run, but a file that is mostly bad, or entirely bad, must fail
loudly and say where. So rows are validated one by one, bad ones are skipped and
counted by reason, and the caller sets how much badness is acceptable.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = ["LoadReport", "DatasetError", "DatasetNotFound", "iter_jsonl", "load_jsonl", "get_path"]

logger = logging.getLogger(__name__)

_BOM = b"\xef\xbb\xbf"
_MAX_EXAMPLES = 5
_MISSING = object()

# Skip reasons (the keys of LoadReport.skipped_by_reason).
BAD_ENCODING = "bad_encoding"
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_KEY = "missing_key"
WRONG_TYPE = "wrong_type"
EMPTY_PROMPT = "empty_prompt"
EMPTY_LABEL = "empty_label"
NON_FINITE_LABEL = "non_finite_label"  # NaN / Infinity: valid to Python's json, never a gradeable answer


class DatasetError(ValueError):
    """A dataset file that cannot be used at all (missing, no valid rows, too many bad rows). The driver
    prints its message alone: it names the file and the reason, a traceback adds nothing."""


class DatasetNotFound(DatasetError, FileNotFoundError):
    """The dataset file does not exist (a FileNotFoundError too, for callers that catch that)."""


@dataclass
class LoadReport:
    """What happened while loading one file: kept rows, skipped rows by reason, first examples."""

    path: str
    n_rows_ok: int = 0
    n_skipped: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def bad_fraction(self) -> float:
        total = self.n_rows_ok + self.n_skipped
        return self.n_skipped / total if total else 0.0

    def most_common_reason(self) -> str | None:
        if not self.skipped_by_reason:
            return None
        return Counter(self.skipped_by_reason).most_common(1)[0][0]

    def record_skip(self, line_no: int, reason: str, detail: str) -> None:
        self.n_skipped += 1
        self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(f"{self.path}:{line_no}: {reason}: {detail}")

    def summary(self) -> str:
        head = f"{self.path}: {self.n_rows_ok} rows ok, {self.n_skipped} skipped"
        if not self.n_skipped:
            return head
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped_by_reason.items()))
        return f"{head} ({reasons}); first: " + " | ".join(self.examples)


def get_path(obj: Any, dotted: str) -> Any:
    """Value at a dotted key path (``"meta.question"``), or a sentinel when absent.

    A literal key containing dots wins over the nested interpretation, so flat
    files with keys like ``"q.text"`` still work.
    """
    if isinstance(obj, dict) and dotted in obj:
        return obj[dotted]
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _label_to_str(value: Any) -> str | None:
    """Labels are strings; numbers are converted (3.0 -> "3" so graders see an integer)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # bool is an int subclass but never a valid answer
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def _label_problem(value: Any, label_key: str) -> tuple[str, str] | None:
    """(reason, detail) when a label cannot be graded: not a string or number, empty, NaN or infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE_LABEL, f"{label_key!r} is {value!r}"
    if _label_to_str(value) is None:
        return WRONG_TYPE, f"{label_key!r} is {type(value).__name__}, not str or number"
    if isinstance(value, str) and not value.strip():
        return EMPTY_LABEL, f"{label_key!r} is empty"
    return None


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes without line ending), streaming."""
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            yield line_no, raw.rstrip(b"\r\n")


def iter_jsonl(
    path: str | os.PathLike[str],
    report: LoadReport,
    prompt_key: str = "prompt",
    label_key: str = "label",
    required_keys: Sequence[str] = (),
    id_key: str = "id",
) -> Iterator[dict]:
    """Yield normalised valid rows, recording skipped ones in ``report``.

    Normalised row: ``{"prompt", "label", "row_id", "source_line", **other fields}``
    where other top-level fields never overwrite the four normalised keys.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFound(f"dataset file not found: {path}")
    consumed = {prompt_key, label_key}
    for line_no, raw in _iter_lines(path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            report.record_skip(line_no, BAD_ENCODING, f"not UTF-8 at byte {e.start}")
            continue
        if not text.strip():
            continue  # blank lines are layout, not data
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            report.record_skip(line_no, INVALID_JSON, e.msg)
            continue
        if not isinstance(obj, dict):
            report.record_skip(line_no, NOT_AN_OBJECT, f"got {type(obj).__name__}")
            continue
        missing = [k for k in (prompt_key, label_key, *required_keys) if get_path(obj, k) is _MISSING]
        if missing:
            report.record_skip(line_no, MISSING_KEY, f"missing key {missing[0]!r}")
            continue
        prompt = get_path(obj, prompt_key)
        if not isinstance(prompt, str):
            report.record_skip(line_no, WRONG_TYPE, f"{prompt_key!r} is {type(prompt).__name__}, not str")
            continue
        if not prompt.strip():
            report.record_skip(line_no, EMPTY_PROMPT, f"{prompt_key!r} is empty")
            continue
        raw_label = get_path(obj, label_key)
        bad_label = _label_problem(raw_label, label_key)
        if bad_label is not None:
            report.record_skip(line_no, *bad_label)
            continue
        label = _label_to_str(raw_label)
        row_id = obj.get(id_key)
        row: dict[str, Any] = {
            "prompt": prompt,
            "label": label,
            "row_id": str(row_id) if isinstance(row_id, (str, int)) and not isinstance(row_id, bool)
            else f"{path}:{line_no}",
            "source_line": line_no,
        }
        for k, v in obj.items():
            if k not in consumed and k not in row:
                row[k] = v
        report.n_rows_ok += 1
        yield row


def load_jsonl(
    path: str | os.PathLike[str],
    prompt_key: str = "prompt",
    label_key: str = "label",
    required_keys: Sequence[str] = (),
    max_bad_fraction: float | None = None,
    id_key: str = "id",
) -> tuple[list[dict], LoadReport]:
    """Load every valid row of a JSONL file; skip and count the bad ones.

    Raises FileNotFoundError for a missing file and DatasetError (a ValueError)
    when no row is valid or the skipped fraction exceeds ``max_bad_fraction``.
    """
    if max_bad_fraction is not None and not 0.0 <= max_bad_fraction <= 1.0:
        raise ValueError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
    report = LoadReport(path=str(path))
    rows = list(iter_jsonl(path, report, prompt_key, label_key, required_keys, id_key))
    if report.n_rows_ok == 0:
        if report.n_skipped == 0:
            raise DatasetError(f"{path}: no rows (the file is empty or blank)")
        reason = report.most_common_reason()
        raise DatasetError(
            f"{path}: no valid rows; {report.n_skipped} skipped, most common reason "
            f"{reason!r} ({report.skipped_by_reason[reason]}x), e.g. {report.examples[0]}"
        )
    if max_bad_fraction is not None and report.bad_fraction > max_bad_fraction:
        raise DatasetError(
            f"{path}: {report.n_skipped}/{report.n_rows_ok + report.n_skipped} rows bad "
            f"({report.bad_fraction:.1%} > max_bad_fraction {max_bad_fraction:.1%}); {report.summary()}"
        )
    if report.n_skipped:
        logger.warning("%s", report.summary())
    else:
        logger.info("%s", report.summary())
    return rows, report
