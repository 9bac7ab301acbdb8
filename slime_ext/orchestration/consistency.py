"""The step-0 consistency check (slime's CI check): before the first update, the trainer's logprobs on the
first rollout batch must match the engine's. A mismatch there means the two do not run the same policy
(different weights after the warm start, another tokenizer or template, a broken weight sync), and every
later step would train on a wrong ratio; it stops the run before anything is trained."""

from __future__ import annotations

from typing import Any, Optional

import torch

from slime_ext.algo.mismatch import mismatch_means, mismatch_sums
from slime_ext.data import Sample
from slime_ext.orchestration.run_dir import RunStopped

SAME_PRECISION_TOLERANCE = 1e-3  # fp32 against fp32: only kernel and batching noise (~1e-6 on CPU)
MIXED_PRECISION_TOLERANCE = 0.1  # a bf16 engine against an fp32 trainer: ~1e-2 on the tiny model
SAME_PRECISION_MAX_KL = 1e-4  # in one precision the approx KL(engine || trainer) must be ~0


class ConsistencyError(RunStopped):
    """The trainer and the engine disagree on the first batch; nothing was trained."""


def engine_precision(cfg: Any) -> str:
    """What the engines run in: `rollout.precision`, else fp32 (embedded engine, CPU server) or bf16 (SGLang on GPUs)."""
    if cfg.rollout.precision is not None:
        return cfg.rollout.precision
    return "bf16" if cfg.rollout.engine == "sglang" and cfg.cluster.gpus_per_node > 0 else "fp32"


def consistency_report(samples: list[Sample], trainer_logprobs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Mean and max |logp_trainer - logp_engine| and the approx KL(engine || trainer) over trained tokens."""
    train, engine, mask = [], [], []
    for s in samples:
        if s.logprobs is None:
            continue
        train.append(trainer_logprobs[s.sample_id].double())
        engine.append(torch.tensor(s.logprobs, dtype=torch.float64))
        mask.append(torch.tensor(s.loss_mask, dtype=torch.float64))
    if not train:
        return {"abs_diff_mean": 0.0, "abs_diff_max": 0.0, "kl": 0.0, "tokens": 0.0}
    sums = mismatch_sums(torch.cat(train), torch.cat(engine), torch.cat(mask))
    return {**mismatch_means(sums), "tokens": sums["tokens"]}


def check_consistency(report: dict[str, float], cfg: Any, tolerance: Optional[float] = None) -> dict[str, float]:
    """Raise ConsistencyError when the report exceeds the tolerance; return the metrics to log."""
    same = engine_precision(cfg) == cfg.train.precision
    tol = tolerance or cfg.train.consistency_tolerance or (SAME_PRECISION_TOLERANCE if same else MIXED_PRECISION_TOLERANCE)
    where = (f"mean |logp_trainer - logp_engine| = {report['abs_diff_mean']:.3g} (max {report['abs_diff_max']:.3g}, "
             f"approx KL {report['kl']:.3g}, over {report['tokens']:.0f} trained tokens)")
    causes = ("Nothing was trained. Usual causes: the engine and the trainer hold different weights (the warm start, "
              "a weight sync), a different tokenizer or chat template, or precision (rollout.precision = "
              f"{engine_precision(cfg)}, train.precision = {cfg.train.precision}). Raise train.consistency_tolerance "
              "or set train.check_consistency_at_start=false to run anyway.")
    if report["abs_diff_mean"] > tol:
        raise ConsistencyError(f"step-0 consistency check failed: {where} exceeds train.consistency_tolerance = "
                               f"{tol:g}. {causes}")
    if same and report["kl"] > SAME_PRECISION_MAX_KL:
        raise ConsistencyError(f"step-0 consistency check failed: in one precision the approx KL should be ~0 "
                               f"(<= {SAME_PRECISION_MAX_KL:g}), but {where}. {causes}")
    return {"consistency/abs_diff_mean": report["abs_diff_mean"], "consistency/abs_diff_max": report["abs_diff_max"],
            "consistency/kl": report["kl"], "consistency/tolerance": tol}
