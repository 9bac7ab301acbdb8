"""Held-out evaluation of a policy: sampled mean@k / pass@k, greedy accuracy, lengths, failure reasons.

`evaluate` runs any engine with the `generate(requests) -> results` interface (the embedded engine, the
SGLang client, or a test stand-in) over held-out `{"prompt", "label"}` rows and scores every response
with the task's verifier. It is deterministic: sample j of row i is drawn with seed
`sample_seed(seed, i, j)` (a hash, so seeds are distinct for all (i, j) in practice and do not depend on
how requests are batched), and its request id is `eval-{i}-{j}` (`eval-{i}-greedy` for the greedy one).

Metrics (all over the first `eval.n_prompts` rows):
- `mean@k`: mean score of the first k samples of each prompt, averaged over prompts (expected accuracy
  of one sample; `mean@1` uses only the first sample, so its standard error is the binomial one);
- `pass@k`: unbiased pass@k (Chen et al. 2021) from the n samples of each prompt, averaged over prompts;
  a sample counts as correct when its score is > 0 (`VerifyResult.passed`);
- `greedy`: mean score of one temperature-0 sample per prompt (when `eval.greedy`);
- `mean@1_stderr`: sqrt(var(first-sample scores) / n_prompts), which is sqrt(p(1-p)/n) for 0/1 scores;
  `mean_score` (all samples) and `mean_score_stderr` (from the per-prompt means) are the tighter estimate;
- lengths in tokens, the fraction of responses cut at `max_new_tokens` (finish_reason "length"), and the
  verifier's reasons (a response the engine failed on counts as score 0 with reason `engine_<finish>`).

Every report also keeps one record per prompt (`records`: prompt id, level, each sample's score, length
and finish reason, the greedy sample's), written by `save_report` to `<name>.records.jsonl` beside the
aggregate `<name>.json`, so later comparisons can pair models prompt by prompt: `compare_table` gives
each mean@k its standard error over prompts and the delta row a paired bootstrap interval
(`slime_ext.algo.eval_stats`) when both reports carry records of the same prompts.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from sglang_patches.decoding import FINISH_LENGTH, SamplingParams
from slime_ext.algo.passk import mean_at_k, pass_at_k_over_prompts
from slime_ext.data.generation import FINISH_FAILED, GenerateRequest, GenerateResult
from slime_ext.rewards import ReasonCounter, VerifyResult, get_verifier
from slime_ext.tasks.templates import get_template

__all__ = ["EvalReport", "evaluate", "compare_table", "sample_seed", "request_row", "make_verifier", "save_report",
           "load_report", "records_path"]

GREEDY = "greedy"


def sample_seed(seed: int, row: int, sample: int | str) -> int:
    """Seed of sample `sample` (an index, or "greedy") of row `row`: a 63-bit hash of the triple."""
    digest = hashlib.sha256(f"slime_ext.tools.eval_checkpoint:{seed}:{row}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def request_row(rid: str) -> int:
    """The row index of an evaluation request id (`eval-{i}-{j}`, `eval-{i}-greedy`): how an engine that wraps
    the requests (multi-turn episodes need their row) finds a request's row."""
    return int(rid.split("-")[1])


def make_verifier(reward_type: str, timeout_s: Optional[float] = None) -> Callable[[str, Any], VerifyResult]:
    """The registered verifier, with its time limit bound when it takes one (`timeout_s`)."""
    verify = get_verifier(reward_type)
    if timeout_s is not None and "timeout_s" in inspect.signature(verify).parameters:
        return partial(verify, timeout_s=timeout_s)
    return verify


@dataclass
class EvalReport:
    n_prompts: int
    n_samples: int
    temperature: float
    mean_at_k: dict[int, float]
    pass_at_k: dict[int, float]
    greedy: Optional[float]
    mean_score: float  # over all sampled responses
    mean_score_stderr: float
    mean_at_1_stderr: float
    mean_response_len: float  # tokens, sampled responses
    greedy_mean_response_len: Optional[float]
    truncation_rate: float  # sampled responses that hit max_new_tokens
    greedy_truncation_rate: Optional[float]
    reasons: dict[str, int]  # verifier reasons over sampled responses
    greedy_reasons: dict[str, int]
    examples: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)  # one per prompt; not part of to_dict

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON form: `mean@k` / `pass@k` keys, `mean@1_stderr`, then the rest (per-prompt records are
        written separately by `save_report`)."""
        out: dict[str, Any] = {"n_prompts": self.n_prompts, "n_samples": self.n_samples,
                               "temperature": self.temperature}
        out.update({f"mean@{k}": v for k, v in sorted(self.mean_at_k.items())})
        out.update({f"pass@{k}": v for k, v in sorted(self.pass_at_k.items())})
        out["greedy"] = self.greedy
        out["mean@1_stderr"] = self.mean_at_1_stderr
        skip = {"n_prompts", "n_samples", "temperature", "mean_at_k", "pass_at_k", "greedy", "mean_at_1_stderr",
                "records"}
        out.update({k: v for k, v in asdict(self).items() if k not in skip})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EvalReport":
        """Inverse of `to_dict` (e.g. an `eval.json` written by `python -m slime_ext.tools.eval_checkpoint`)."""
        mean = {int(k.split("@", 1)[1]): float(v) for k, v in data.items() if k.startswith("mean@") and k[5:].isdigit()}
        passk = {int(k.split("@", 1)[1]): float(v) for k, v in data.items() if k.startswith("pass@") and k[5:].isdigit()}
        return cls(
            n_prompts=int(data["n_prompts"]), n_samples=int(data["n_samples"]),
            temperature=float(data.get("temperature", 1.0)), mean_at_k=mean, pass_at_k=passk,
            greedy=data.get("greedy"), mean_score=float(data.get("mean_score", mean.get(1, 0.0))),
            mean_score_stderr=float(data.get("mean_score_stderr", 0.0)),
            mean_at_1_stderr=float(data.get("mean@1_stderr", 0.0)),
            mean_response_len=float(data.get("mean_response_len", 0.0)),
            greedy_mean_response_len=data.get("greedy_mean_response_len"),
            truncation_rate=float(data.get("truncation_rate", 0.0)),
            greedy_truncation_rate=data.get("greedy_truncation_rate"),
            reasons=dict(data.get("reasons", {})), greedy_reasons=dict(data.get("greedy_reasons", {})),
            examples=list(data.get("examples", [])), meta=dict(data.get("meta", {})),
        )

    def prompt_scores(self, k: int | str | None = None) -> Optional[list[float]]:
        """Per-prompt mean score of the first k samples (all when k is None), or the greedy score when k is
        "greedy"; None when the report has no records (or no greedy samples)."""
        if not self.records:
            return None
        if k == GREEDY:
            values = [r.get("greedy_score") for r in self.records]
            return None if any(v is None for v in values) else [float(v) for v in values]
        firsts = [r["scores"][: int(k)] if k is not None else r["scores"] for r in self.records]
        return [sum(f) / len(f) for f in firsts]

    def prompt_metric(self, name: str) -> Optional[list[Optional[float]]]:
        """Per-prompt mean of a method metric over the sampled responses that define it (`record.response_metrics`;
        None for a prompt where none does); None when the records do not keep that metric (older runs)."""
        if not self.records or any(name not in r.get("response_metrics", {}) for r in self.records):
            return None
        values = [[v for v in r["response_metrics"][name] if v is not None] for r in self.records]
        return [sum(v) / len(v) if v else None for v in values]

    def prompt_ids(self) -> list[str]:
        return [str(r["prompt_id"]) for r in self.records]


def records_path(report_json: Path | str) -> Path:
    """Where the per-prompt records of `eval_x.json` live: `eval_x.records.jsonl` beside it."""
    p = Path(report_json)
    return p.with_name(p.stem + ".records.jsonl")


def save_report(report: EvalReport, path: Path | str) -> Path:
    """Write the aggregates (`path`, JSON) and the per-prompt records (`records_path(path)`, JSONL), each
    through a temporary file so a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    targets = [(path, json.dumps(report.to_dict(), indent=2) + "\n")]
    if report.records:
        targets.append((records_path(path), "".join(json.dumps(r) + "\n" for r in report.records)))
    for target, text in targets:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(target)
    return path


def load_report(path: Path | str) -> EvalReport:
    """Inverse of `save_report`; a report saved without records (older runs) loads with none. The records may be
    gzipped beside it (`<records>.gz`, as a study keeps a run's files under `results/`)."""
    path = Path(path)
    report = EvalReport.from_dict(json.loads(path.read_text()))
    side = records_path(path)
    zipped = side.with_name(side.name + ".gz")
    if side.exists():
        text = side.read_text()
    elif zipped.exists():
        text = gzip.decompress(zipped.read_bytes()).decode()
    else:
        return report
    report.records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return report


def _stderr(values: Sequence[float]) -> float:
    """sqrt(population variance / n): the binomial sqrt(p(1-p)/n) for 0/1 values."""
    n = len(values)
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / n / n)


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def _metric_means(records: Sequence[dict]) -> dict[str, float]:
    """Each method metric's mean over the sampled responses that define it, from the records' per-sample lists
    (`meta.response_metrics`); NaN for a metric no response defines."""
    keys = dict.fromkeys(k for r in records for k in r.get("response_metrics", {}))
    return {k: _nanmean([v for r in records for v in r.get("response_metrics", {}).get(k, []) if v is not None])
            for k in keys}


def _score(result: GenerateResult, text: str, label: Any, verify: Callable) -> VerifyResult:
    if result.finish_reason == FINISH_FAILED or result.error:
        return VerifyResult(0.0, f"engine_{result.finish_reason}", detail=(result.error or "")[:300])
    return verify(text, label)


def evaluate(
    engine: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    eval_cfg: Any,
    reward_type: str = "math",
    template: str = "plain",
    max_new_tokens: int = 160,
    seed: int = 0,
    progress: bool = True,
    *,
    batch_prompts: int = 64,
    stop: Sequence[str] = (),
    verifier: Optional[Callable[[str, Any], VerifyResult]] = None,
    n_examples: int = 4,
    sampler_specs: Sequence[dict] = (),
    project: Optional[Callable[[GenerateResult], str]] = None,
    response_metrics: Optional[Callable[[GenerateResult], dict[str, float]]] = None,
) -> EvalReport:
    """Generate `eval_cfg.n_samples` samples (+1 greedy when `eval_cfg.greedy`) for each of the first
    `eval_cfg.n_prompts` rows, `batch_prompts` prompts per `engine.generate` call, and score them.

    `eval_cfg` needs `n_prompts`, `n_samples`, `k`, `temperature`, `greedy` (an `EvalConfig`).
    `verifier` overrides `get_verifier(reward_type)`. Methods with their own response format pass
    `sampler_specs` (attached to every request), `project` (the text to score, e.g. SxS's visible
    answer) and `response_metrics` (per sampled response; their means go to `meta["response_metrics"]`, each prompt's
    values to its record's `response_metrics`, None where a metric is undefined, so a study can pair a metric prompt
    by prompt as it pairs scores).
    """
    from tqdm import tqdm

    rows = list(rows)[: eval_cfg.n_prompts]
    if not rows:
        raise ValueError("evaluate needs at least one held-out row")
    n = int(eval_cfg.n_samples)
    ks = sorted(set(int(k) for k in eval_cfg.k))
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"eval k values {bad} must lie in [1, n_samples={n}]")
    if batch_prompts < 1:
        raise ValueError(f"batch_prompts must be >= 1, got {batch_prompts}")
    verify = verifier or get_verifier(reward_type)
    fmt = get_template(template)
    sampled = SamplingParams(temperature=float(eval_cfg.temperature), max_new_tokens=max_new_tokens, stop=list(stop))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=list(stop))
    per_row = n + (1 if eval_cfg.greedy else 0)

    scores: list[list[float]] = [[0.0] * n for _ in rows]
    lengths: list[int] = []
    truncated = 0
    reasons = ReasonCounter()
    g_scores: list[float] = []
    g_lengths: list[int] = []
    g_truncated = 0
    g_reasons = ReasonCounter()
    examples: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    start = time.perf_counter()

    bar = tqdm(total=len(rows) * per_row, desc="eval", unit="resp", file=sys.stderr, disable=not progress)
    try:
        for lo in range(0, len(rows), batch_prompts):
            batch = list(range(lo, min(lo + batch_prompts, len(rows))))
            requests: list[GenerateRequest] = []
            for i in batch:
                ids = list(tokenizer(fmt.format(rows[i]["prompt"]))["input_ids"])
                for j in range(n):
                    requests.append(GenerateRequest(f"eval-{i}-{j}", ids, sampled, sample_seed(seed, i, j),
                                                    list(sampler_specs), return_logprob=False))
                if eval_cfg.greedy:
                    requests.append(GenerateRequest(f"eval-{i}-{GREEDY}", ids, greedy, sample_seed(seed, i, GREEDY),
                                                    list(sampler_specs), return_logprob=False))
            results = engine.generate(requests)
            if len(results) != len(requests):
                raise RuntimeError(f"engine returned {len(results)} results for {len(requests)} requests")
            by_rid = {r.rid: r for r in results}
            for i in batch:
                row = rows[i]
                example: dict[str, Any] = {}
                record: dict[str, Any] = {"prompt_id": str(row.get("id", i)), "row": i, "level": row.get("level"),
                                          "scores": [], "lengths": [], "finish_reasons": []}
                for j in list(range(n)) + ([GREEDY] if eval_cfg.greedy else []):
                    result = by_rid[f"eval-{i}-{j}"]
                    text = project(result) if project else tokenizer.decode(result.output_ids, skip_special_tokens=True)
                    v = _score(result, text, row["label"], verify)
                    if response_metrics is not None and j != GREEDY:
                        per_sample = record.setdefault("response_metrics", {})
                        for key, value in response_metrics(result).items():
                            per_sample.setdefault(key, []).append(None if value != value else value)  # NaN: JSON null
                    cut = result.finish_reason == FINISH_LENGTH
                    if j == GREEDY:
                        g_scores.append(float(v.score))
                        g_lengths.append(len(result.output_ids))
                        g_truncated += cut
                        g_reasons.add(v)
                        example.update(greedy_response=text, greedy_score=float(v.score))
                        record.update(greedy_score=float(v.score), greedy_length=len(result.output_ids),
                                      greedy_finish_reason=result.finish_reason)
                    else:
                        scores[i][j] = float(v.score)
                        lengths.append(len(result.output_ids))
                        truncated += cut
                        reasons.add(v)
                        record["scores"].append(float(v.score))
                        record["lengths"].append(len(result.output_ids))
                        record["finish_reasons"].append(result.finish_reason)
                        if j == 0:
                            example.update(prompt=row["prompt"], label=row["label"], response=text,
                                           score=float(v.score), reason=v.reason, finish_reason=result.finish_reason)
                records.append(record)
                if len(examples) < n_examples:
                    examples.append(example)
            bar.update(len(requests))
    finally:
        bar.close()

    counts = [(n, sum(1 for s in row_scores if s > 0)) for row_scores in scores]
    per_prompt_mean = [sum(s) / n for s in scores]
    return EvalReport(
        n_prompts=len(rows),
        n_samples=n,
        temperature=float(eval_cfg.temperature),
        mean_at_k={k: mean_at_k(scores, k) for k in ks},
        pass_at_k={k: pass_at_k_over_prompts(counts, k) for k in ks},
        greedy=sum(g_scores) / len(g_scores) if g_scores else None,
        mean_score=sum(per_prompt_mean) / len(rows),
        mean_score_stderr=_stderr(per_prompt_mean),
        mean_at_1_stderr=_stderr([s[0] for s in scores]),
        mean_response_len=sum(lengths) / len(lengths),
        greedy_mean_response_len=sum(g_lengths) / len(g_lengths) if g_lengths else None,
        truncation_rate=truncated / len(lengths),
        greedy_truncation_rate=g_truncated / len(g_lengths) if g_lengths else None,
        reasons=reasons.as_dict(),
        greedy_reasons=g_reasons.as_dict(),
        examples=examples,
        meta={"reward_type": reward_type, "template": template, "max_new_tokens": max_new_tokens, "seed": seed,
              "elapsed_s": round(time.perf_counter() - start, 3),
              **({"response_metrics": means} if (means := _metric_means(records)) else {})},
        records=records,
    )


def _pts(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _delta(a: Optional[float], b: Optional[float], scale: float = 100.0) -> str:
    if a is None or b is None:
        return "-"
    return f"{scale * (b - a):+.1f}"


def _stderr_cell(report: EvalReport, k: int) -> str:
    """` ± SE` of mean@k over prompts: from the records when present, else mean@1's stored standard error."""
    from slime_ext.algo.eval_stats import stderr_over_prompts

    scores = report.prompt_scores(k)
    if scores is not None:
        return f" ± {100 * stderr_over_prompts(scores):.1f}"
    return f" ± {100 * report.mean_at_1_stderr:.1f}" if k == 1 else ""


def _pairable(a: EvalReport, b: EvalReport) -> bool:
    """Both reports carry per-prompt records of the same prompts, in the same order."""
    return bool(a.records and b.records) and a.prompt_ids() == b.prompt_ids()


def _paired(a: EvalReport, b: EvalReport, k: int | str) -> Optional[Any]:
    """Paired bootstrap difference of b - a on metric k when both carry records of the same prompts."""
    from slime_ext.algo.eval_stats import paired_difference

    if not _pairable(a, b):
        return None
    xs, ys = a.prompt_scores(k), b.prompt_scores(k)
    return paired_difference(xs, ys) if xs is not None and ys is not None else None


def _delta_cell(a: EvalReport, b: EvalReport, k: int | str, va: Optional[float], vb: Optional[float]) -> str:
    diff = _paired(a, b, k)
    if diff is None:
        return _delta(va, vb)
    cell = f"{100 * diff.mean:+.1f} ± {100 * diff.stderr:.1f} [{100 * diff.ci_low:+.1f}, {100 * diff.ci_high:+.1f}]"
    return cell if diff.measured else cell + " (n.s.)"


def compare_table(reports: Mapping[str, EvalReport]) -> str:
    """Markdown table, one row per model (accuracies in %, each mean@k with its standard error over prompts),
    plus a delta row (last minus first; accuracies in percentage points, length in tokens) for 2+ models.
    When both ends carry per-prompt records of the same prompts, each mean@k and greedy delta is paired:
    `+d ± SE [95% bootstrap CI]`, marked "(n.s.)" when the interval contains zero, and a note under the
    table says so; without records the delta is the plain difference."""
    from slime_ext.algo.eval_stats import CONFIDENCE, N_RESAMPLES

    if not reports:
        raise ValueError("compare_table needs at least one report")
    names = list(reports)
    ks = sorted({k for r in reports.values() for k in (*r.mean_at_k, *r.pass_at_k)})
    mean_ks = [k for k in ks if any(k in r.mean_at_k for r in reports.values())]
    pass_ks = [k for k in ks if any(k in r.pass_at_k for r in reports.values())]
    header = ["model", *(f"mean@{k}" for k in mean_ks), *(f"pass@{k}" for k in pass_ks), "greedy",
              "mean length", "n"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    for name in names:
        r = reports[name]
        cells = [name]
        for k in mean_ks:
            v = r.mean_at_k.get(k)
            cells.append(_pts(v) + (_stderr_cell(r, k) if v is not None else ""))
        cells += [_pts(r.pass_at_k.get(k)) for k in pass_ks]
        cells += [_pts(r.greedy), f"{r.mean_response_len:.1f}", f"{r.n_prompts}x{r.n_samples}"]
        lines.append("| " + " | ".join(cells) + " |")
    paired = False
    if len(names) >= 2:
        a, b = reports[names[0]], reports[names[-1]]
        paired = _pairable(a, b)
        cells = [f"delta ({names[-1]} - {names[0]}), points"]
        cells += [_delta_cell(a, b, k, a.mean_at_k.get(k), b.mean_at_k.get(k)) for k in mean_ks]
        cells += [_delta(a.pass_at_k.get(k), b.pass_at_k.get(k)) for k in pass_ks]
        cells += [_delta_cell(a, b, GREEDY, a.greedy, b.greedy), _delta(a.mean_response_len, b.mean_response_len, 1.0), ""]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    note = "± is the standard error over prompts."
    if paired:
        note += (f" Deltas: paired over the same {reports[names[0]].n_prompts} prompts, ± SE "
                 f"[{100 * CONFIDENCE:.0f}% percentile bootstrap interval, {N_RESAMPLES} resamples, seed 0]; "
                 "(n.s.): the interval contains 0, no measured difference.")
    return table + "\n\n" + note
