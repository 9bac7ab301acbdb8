"""SxS data construction at scale: concurrent prefix checks, cancellation, resume, report.

For one example every reasoning prefix R_1..k is checked against the whole answer (shown = 0) in
parallel on a bounded pool; when a prefix returns full coverage, the checks of longer prefixes that
have not started are cancelled (monotone repair makes them full anyway). The sequential count is what
the naive builder spends: one check per prefix. Finished examples are appended to the output JSONL as
they complete, so an interrupted build resumes by skipping the ids already there.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from slime_ext.methods.sxs.interleave import interleave, render, segment
from slime_ext.methods.sxs.oracles import Oracle


@dataclass
class BuildReport:
    examples: int = 0
    skipped_done: int = 0
    failures: list[dict] = field(default_factory=list)
    checks_made: int = 0
    checks_sequential: int = 0
    cancelled: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"examples": self.examples, "skipped_already_done": self.skipped_done, "failures": self.failures,
                "oracle_checks_made": self.checks_made, "oracle_checks_sequential": self.checks_sequential,
                "cancelled_checks": self.cancelled}


def coverage_counts(oracle: Oracle, example: dict, reasoning: list[str], answer: list[str],
                    pool: ThreadPoolExecutor) -> tuple[list[int], int, int]:
    """Raw coverage per prefix (full for prefixes after the first full one), checks made, checks cancelled."""
    full = len(answer)
    futures: dict[Future, int] = {pool.submit(oracle.coverage, example["question"], reasoning[: k + 1], answer, 0, example): k
                                  for k in range(len(reasoning))}
    raw: dict[int, int] = {}
    first_full: Optional[int] = None
    pending = set(futures)
    cancelled = 0
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                if fut.cancelled():
                    continue
                k = futures[fut]
                raw[k] = fut.result()
                if raw[k] >= full and (first_full is None or k < first_full):
                    first_full = k
                    for other, j in futures.items():
                        if j > k and other.cancel():
                            cancelled += 1
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    made = len(raw)
    counts = [raw.get(k, full) if first_full is None or k <= first_full else full for k in range(len(reasoning))]
    return counts, made, cancelled


def build_example(example: dict, oracle: Oracle, pool: ThreadPoolExecutor) -> tuple[dict, int, int]:
    reasoning, answer = segment(example["reasoning"]), segment(example["answer"])
    counts, made, cancelled = coverage_counts(oracle, example, reasoning, answer, pool)
    blocks = interleave(reasoning, answer, counts)
    row = {"id": example["id"], "question": example["question"], "label": example.get("label"),
           "text": render(blocks), "blocks": [[b.channel, b.text] for b in blocks], "coverage_raw": counts}
    return row, made, cancelled


def build(examples: Iterable[dict], oracle: Oracle, out_path: str | Path, concurrency: int = 8,
          progress: Optional[Callable[[int], None]] = None) -> BuildReport:
    """Build every example not already in `out_path` (append-only JSONL); returns the report."""
    out = Path(out_path)
    done = set()
    if out.exists():
        raw = out.read_bytes()
        if raw and not raw.endswith(b"\n"):  # a row cut by a crash: drop it, it is built again
            out.write_bytes(raw[: raw.rfind(b"\n") + 1])
        for line in out.read_text().splitlines():
            if line.strip():
                try:
                    done.add(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a line cut by a crash: that example is built again
    report = BuildReport()
    lock = threading.Lock()
    out.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool, out.open("a") as f:
        for i, ex in enumerate(examples):
            for key in ("id", "question", "reasoning", "answer"):
                if key not in ex:
                    raise ValueError(f"example {i}: missing {key!r} (need id, question, reasoning, answer)")
            if ex["id"] in done:
                report.skipped_done += 1
                continue
            n_prefixes = len(segment(ex["reasoning"]))
            try:
                row, made, cancelled = build_example(ex, oracle, pool)
            except Exception as exc:  # noqa: BLE001 - recorded, the build goes on
                report.failures.append({"id": ex["id"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            with lock:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                report.examples += 1
                report.checks_made += made
                report.cancelled += cancelled
                report.checks_sequential += n_prefixes
            if progress:
                progress(report.examples)
    return report
