"""Each held-out prompt's probability of asking the cloud, from K sampled answers per prompt, against the model's
own competence on it:

    python -m slime_ext.tools.eval_checkpoint RUN_DIR --dagrpo-ask-samples 8 --skip-eval [--out RUN_DIR/eval.json]

Why: the phase evaluations take one sampled answer per prompt, which cannot tell a prompt that asks a third of the
time from one that always or never asks, and greedy decoding never asked in the v2 runs. With K answers per prompt
the question "did the policy learn *when* to ask" has a direct measure: the area under the ROC curve of the
per-prompt ask probability for the prompts the model's own greedy answer gets wrong (0.5: asking is blind to
competence; 1: it asks exactly where it would fail), overall and within each level (which separates "asks more on
harder levels" from "asks where it, on this prompt, would be wrong").

RUN_DIR is a finished DA-GRPO or fixed-reward run (its `config.yaml` and final `hf*` checkpoint); each of its
`dagrpo.phases` is evaluated on the phase's held-out prompts (`eval.n_prompts`), once greedy and K times at
`eval.temperature` (the phase evaluations' sampled setting; sample j uses seeds seed + j x n + i, so sample 0 has
the seeds of the phase evaluations' sampled draw). Writes `<out stem>_ask_probability.json` (with `--out
RUN_DIR/eval.json`: RUN_DIR/eval_ask_probability.json; per phase, `summarise`) and the per-prompt records beside
it (`*.records.jsonl`, kept gzipped by a study like every evaluation's records: greedy correctness and asking, and
each sample's asking and joint correctness). `--skip-eval` leaves out the tool's generic evaluation of the run's
eval split, which this measure does not use.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

log = logging.getLogger("slime_ext.methods.dagrpo.ask_probability")
BOOTSTRAP_RESAMPLES = 1000
ASK_FILE = "eval_ask_probability.json"  # with --out RUN/eval.json; eval_*: a study keeps it (records gzipped)


def sample_asks(method: Any, engine: Any, rows: list[dict], template: str, seed: int, samples: int,
                temperature: float, progress: Callable[[str], None] = lambda m: None) -> list[dict]:
    """Per prompt: greedy correctness and asking, then `samples` sampled answers' asking and joint correctness."""
    greedy: list[dict] = []
    method.evaluate_rows(engine, rows, template, seed=seed, baselines=False, records=greedy)
    out = [{"prompt_id": g["prompt_id"], "level": g["level"], "greedy_correct": g["correct"],
            "greedy_asked": g["asked"], "asks": [], "correct": []} for g in greedy]
    for j in range(samples):
        sampled: list[dict] = []
        method.evaluate_rows(engine, rows, template, seed=seed + j * len(rows), baselines=False, records=sampled,
                             temperature=temperature)
        for entry, s in zip(out, sampled):
            entry["asks"].append(bool(s["asked"]))
            entry["correct"].append(float(s["correct"]))
        progress(f"sample {j + 1}/{samples}: asked on {np.mean([s['asked'] for s in sampled]):.3f} of {len(rows)}")
    return out


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive's score > a negative's) + half the ties: the Mann-Whitney U over the pairs; nan when a class is
    empty."""
    from scipy.stats import mannwhitneyu

    pos, neg = np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    return float(mannwhitneyu(pos, neg, method="asymptotic").statistic / (pos.size * neg.size))


def stratified_auc(scores: np.ndarray, positive: np.ndarray, strata: np.ndarray) -> float:
    """The AUC over pairs within the same stratum only (a weighted mean of the strata's AUCs, weights = their
    positive x negative pairs): within levels, a prompt is compared only with prompts of its own level (and seed)."""
    total, weight = 0.0, 0
    for s in np.unique(strata):
        inside = strata == s
        pos, neg = scores[inside & positive], scores[inside & ~positive]
        if pos.size and neg.size:
            total += auc(pos, neg) * pos.size * neg.size
            weight += pos.size * neg.size
    return total / weight if weight else float("nan")


def _interval(values: np.ndarray) -> list[float]:
    finite = values[np.isfinite(values)]
    return [float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))] if finite.size else [float("nan")] * 2


def level_alone_reference(p: np.ndarray, levels: np.ndarray, samples: int) -> dict[str, float]:
    """The shares of prompts with p = 0 and p > 0.5 expected if every prompt of a level (and stratum) asked with the
    same probability, its level's mean p (binomial over the K samples): more prompts at 0 or above 0.5 than this
    means asking differs between prompts of one level."""
    from scipy.stats import binom

    if samples == 0:
        return {"share_never_asks_level_alone": float("nan"), "share_asks_over_half_level_alone": float("nan")}
    level_mean = {lv: p[levels == lv].mean() for lv in np.unique(levels)}
    m = np.array([level_mean[lv] for lv in levels])
    return {"share_never_asks_level_alone": float(binom.pmf(0, samples, m).mean()),
            "share_asks_over_half_level_alone": float(binom.sf(samples // 2, samples, m).mean())}


def summarise(records: list[dict], stratum: Callable[[dict], Any] = lambda r: 0, seed: int = 0) -> dict:
    """Per-prompt ask probability p (the share of a prompt's samples that asked): its mean, how many prompts have
    p = 0, p > 0.5 and p = 1, p on the prompts the greedy answer gets wrong and right, the AUC of p for greedy-wrong
    (within `stratum`, e.g. the seed) and within level and stratum, with bootstrap 95% intervals over prompts.
    Prompts whose greedy answer asked have no local answer to judge competence by; they count in the shares only."""
    p = np.array([np.mean(r["asks"]) for r in records], dtype=np.float64)
    judged = np.array([not r["greedy_asked"] for r in records])
    wrong = np.array([r["greedy_correct"] <= 0 for r in records]) & judged
    right = ~wrong & judged
    strata = np.array([str(stratum(r)) for r in records])
    levels = np.array([f"{stratum(r)}|{r['level']}" for r in records])
    levels_seen = sorted({r["level"] for r in records})
    out: dict[str, Any] = {
        "prompts": len(records), "samples_per_prompt": len(records[0]["asks"]) if records else 0,
        "mean_ask_probability": float(p.mean()) if p.size else float("nan"),
        "share_never_asks": float(np.mean(p == 0)), "share_asks_over_half": float(np.mean(p > 0.5)),
        "share_always_asks": float(np.mean(p == 1)), "greedy_asked": int((~judged).sum()),
        "greedy_wrong": int(wrong.sum()), "greedy_right": int(right.sum()),
        "ask_probability_greedy_wrong": float(p[wrong].mean()) if wrong.any() else float("nan"),
        "ask_probability_greedy_right": float(p[right].mean()) if right.any() else float("nan"),
        "by_level": {lv: float(p[[r["level"] == lv for r in records]].mean()) for lv in levels_seen},
        **level_alone_reference(p, levels, len(records[0]["asks"]) if records else 0),
    }
    rng = np.random.default_rng(seed)
    stats = {"auc": lambda i: stratified_auc(p[i][judged[i]], wrong[i][judged[i]], strata[i][judged[i]]),
             "auc_within_level": lambda i: stratified_auc(p[i][judged[i]], wrong[i][judged[i]], levels[i][judged[i]]),
             "wrong_minus_right": lambda i: (p[i][wrong[i]].mean() - p[i][right[i]].mean()
                                             if wrong[i].any() and right[i].any() else float("nan"))}
    everything = np.arange(len(records))
    draws = [rng.integers(0, len(records), len(records)) for _ in range(BOOTSTRAP_RESAMPLES)] if records else []
    for name, stat in stats.items():
        out[name] = float(stat(everything)) if records else float("nan")
        out[f"{name}_95ci"] = _interval(np.array([stat(d) for d in draws], dtype=np.float64)) if draws else [float("nan")] * 2
    return out


def checkpoint_evaluation(checkpoint: Path, samples: str, tokenizer: Any, rows: Sequence[dict], cfg: Any, out: Path,
                          load_engine: Callable[[str], Any]) -> Path:
    """`eval_checkpoint --dagrpo-ask-samples K`: the per-prompt ask probability of the checkpoint on every phase's
    held-out prompts (the run config's `dagrpo.phases`, not `rows`), into `<out stem>_ask_probability.json` and its
    records beside the evaluation, and printed. `cfg` has its `solver:` URLs already served (the tool does it)."""
    from slime_ext.evaluation import records_path
    from slime_ext.methods.registry import build_method

    k = int(samples) if str(samples).isdigit() else 0
    if k < 1:
        raise ValueError(f"a number of samples of at least 1, got {samples!r}")
    if cfg.dagrpo.local_only:
        raise ValueError("dagrpo.local_only: a local-only run never asks; nothing to measure")
    if cfg.eval.temperature <= 0:
        raise ValueError(f"eval.temperature is {cfg.eval.temperature}; sampled answers need it above 0")
    method = build_method(cfg, tokenizer)
    engine = load_engine(str(checkpoint))
    summary: dict[str, Any] = {"checkpoint": str(checkpoint), "samples": k, "temperature": cfg.eval.temperature,
                               "phases": {}}
    records: list[dict] = []
    for index, phase in enumerate(cfg.dagrpo.phases):
        phase_rows = method.phase_rows(index)[1][: cfg.eval.n_prompts]
        log.info("phase %s: %d prompts x (1 greedy + %d sampled)", phase.name, len(phase_rows), k)
        phase_records = sample_asks(method, engine, phase_rows, cfg.data.template, cfg.run.seed, k,
                                    cfg.eval.temperature, lambda m, name=phase.name: log.info("%s: %s", name, m))
        summary["phases"][phase.name] = summarise(phase_records)
        records += [{"phase": phase.name, **r} for r in phase_records]
    path = out.with_name(out.stem + "_ask_probability.json")
    path.write_text(json.dumps(summary, indent=2) + "\n")
    records_path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
    for name, s in summary["phases"].items():
        auc_ci, level_ci = (", ".join(f"{x:.3f}" for x in s[key]) for key in ("auc_95ci", "auc_within_level_95ci"))
        print(f"{name}: mean p {s['mean_ask_probability']:.3f}, p > 0.5 on {s['share_asks_over_half']:.3f}, "
              f"AUC for greedy-wrong {s['auc']:.3f} [{auc_ci}], within level {s['auc_within_level']:.3f} [{level_ci}]")
    print(f"wrote {path} and {records_path(path)}")
    return path
