"""DUET (METHODS.md section 2): a token budget per step, Neyman allocation across prompts, the
marker-gated abort, and importance weights that keep the gradient unbiased.

plan:   s_q = max(s_floor, sigma_q) and L_q from the controller state -> n_q by bisection (warm-started
        lambda) or the exact knapsack under the step's budget B; every request carries the gate sampler
        with the current K1 / K2.
finish: rewards for all rollouts; the GRPO group baseline includes aborted ones; aborted rollouts then
        get advantage 0, an all-zero mask and weight 0; kept ones weight 1 / (s_pre_q * p_keep) with
        s_pre from the counts actually rolled out; the controller state is updated (sigma_q from kept
        rollouts, L_q, the K window).
"""

from __future__ import annotations

import math
import time
from statistics import mean
from typing import Any, Optional

from sglang_patches.duet import gate_outcome
from slime_ext.algo.duet_allocation import bisect_allocation, knapsack_allocation, stratification_factors
from slime_ext.algo.duet_stats import LengthWindow, PromptStats, unbiasing_weight, within_step_sigma
from slime_ext.config.schema import Config
from slime_ext.data import Sample
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo import GRPO

MARKER_TASK = {"math": "math", "code": "code", "mc": "qa"}


def prompt_key(row: dict) -> str:
    return str(row.get("row_id", row.get("id", row["prompt"])))


class Duet(GRPO):
    name = "duet"

    def __init__(self, config: Config):
        super().__init__(config)
        d, r = config.duet, config.rollout
        self.stats = PromptStats(d.s_floor_cold, default_length=0.5 * r.max_response_len)
        self.window = LengthWindow(r.max_response_len, d.length_window, d.refit_every, d.k1_quantile, d.k2_quantile)
        self.lam: Optional[float] = None
        self.data_epoch = 0  # set by the rollout manager before each step
        self._step_info: dict[str, Any] = {}
        self.task = MARKER_TASK.get(config.reward.type, "math")

    def budget(self, lengths: list[float]) -> float:
        """B: `duet.budget_tokens`, or `budget_fraction` of full GRPO (n_samples_per_prompt rollouts of
        every prompt at its expected length)."""
        d = self.config.duet
        if d.budget_tokens:
            return float(d.budget_tokens)
        return float(d.budget_fraction) * self.config.rollout.n_samples_per_prompt * sum(lengths)

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        t0 = time.perf_counter()
        d = self.config.duet
        if self.data_epoch >= 1:
            self.stats.end_epoch()
        keys = [prompt_key(p) for p in prompts]
        s = [self.stats.s(k) for k in keys]
        lengths = [self.stats.L(k) for k in keys]
        budget = self.budget(lengths)
        if d.allocator == "knapsack":
            alloc = knapsack_allocation(s, lengths, budget, d.n_min, d.n_max)
        else:
            alloc = bisect_allocation(s, lengths, budget, d.n_min, d.n_max, d.bisection_iters, lam_init=self.lam)
        if math.isfinite(alloc.lam) and alloc.lam > 0:
            self.lam = alloc.lam
        spec = {"kind": "duet_gate", "k1": self.window.k1, "k2": self.window.k2, "grace": d.grace, "poll": d.poll,
                "window": d.marker_window, "eps_abort": d.eps_abort, "task": self.task, "trim_entropy": d.trim_entropy}
        self._step_info = {"budget": budget, "keys": keys, "n": alloc.n, "k1": self.window.k1, "k2": self.window.k2,
                           "lam": alloc.lam, "saturated": alloc.saturated, "plan_s": time.perf_counter() - t0}
        return [PromptPlan(n, self.sampling, [dict(spec)]) for n in alloc.n]

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        samples = [s for g in groups for s in g]
        for s in samples:
            did_abort, propensity, marker = gate_outcome(s.metadata.get("annotations") or [])
            s.metadata.update(did_abort=did_abort, keep_propensity=propensity, marker_at=marker)
        metrics = super().finish(groups, step)  # rewards and the group baseline over ALL rollouts
        t0 = time.perf_counter()
        d = self.config.duet
        s_pre = stratification_factors([len(g) for g in groups], d.eps_pre)
        keys = self._step_info.get("keys") or [s[0].group_id or "" for s in groups]
        natural = []
        for q, group in enumerate(groups):
            kept = []
            for s in group:
                if s.metadata["did_abort"]:
                    s.advantage, s.weight = 0.0, 0.0
                    s.loss_mask = [0.0] * s.response_len
                    continue
                s.weight = unbiasing_weight(False, s.metadata["keep_propensity"], s_pre[q])
                kept.append(s)
                if s.metadata.get("finish_reason") == "stop":
                    natural.append(s.response_len)
            sigma = within_step_sigma([s.advantage for s in kept], [sum(s.logprobs or [0.0]) for s in kept])
            self.stats.observe(keys[q], sigma, [s.response_len for s in kept])
        self.window.add(natural)
        info = self._step_info
        generated = sum(s.response_len for s in samples)
        weights = [s.weight for s in samples if not s.metadata["did_abort"]]
        metrics.update({
            "duet/lambda": info.get("lam", float("nan")), "duet/k1": info.get("k1", 0), "duet/k2": info.get("k2", 0),
            "duet/budget_tokens": info.get("budget", float("nan")), "duet/generated_tokens": generated,
            "duet/tokens_over_budget": generated / info["budget"] if info.get("budget") else float("nan"),
            "duet/abort_rate": mean(s.metadata["did_abort"] for s in samples),
            "duet/marker_rate": mean(s.metadata["marker_at"] is not None for s in samples),
            "duet/mean_is_weight": mean(weights) if weights else 0.0,
            "duet/n_min": min(len(g) for g in groups), "duet/n_max": max(len(g) for g in groups),
            "duet/n_mean": mean(len(g) for g in groups), "duet/rollouts": len(samples),
            "duet/s_floor": self.stats.floor,
            "time/controller": info.get("plan_s", 0.0) + time.perf_counter() - t0,
        })
        return metrics

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        refit = self.window.end_step()
        return {"duet/k_refit": float(refit)}

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats.state_dict(), "window": self.window.state_dict(), "lam": self.lam}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.stats.load_state_dict(state["stats"])
        self.window.load_state_dict(state["window"])
        self.lam = state["lam"]
