"""DUET (docs/methods/duet.md): a token budget per step, Neyman allocation across prompts, the
marker-gated abort, and importance weights that keep the gradient unbiased.

plan:   s_q = max(s_floor, sigma_q) and L_q from the controller state -> n_q by bisection (warm-started
        lambda) or the exact knapsack under the step's budget B; every request carries the gate sampler
        with the current K1 / K2.
finish: rewards for all rollouts; the GRPO group baseline includes aborted ones; aborted rollouts then
        get advantage 0, an all-zero mask and weight 0; kept ones weight 1 / (s_pre_q * p_keep) with
        s_pre from the counts actually rolled out; the controller state is updated (sigma_q from kept
        rollouts, L_q, the K window).

The budget. B bounds the planned cost sum_q n_q L_q (the allocator returns the side within B). For the
realised tokens to match it, L_q must be what a rollout of q costs under the gate, so L_q is the running
mean over ALL of q's rollouts (aborted ones included: they cost k2 + G + 1 tokens each) of their
budgeted length: the response length, except that an eps-kept rollout counts only up to the gate's
draw plus one token (what its abort would have cost). That is Proposition 1's "realised expected length
under the abort policy". (A mean over kept rollouts only, as the paper's text words it, leaves the aborted
rollouts' tokens out of the cost: 1.13-1.16 B spent per step in tests/test_duet_method.py's setup.)
Guarantees per step:
  planned  = sum_q n_q L_q <= B                                           (always)
  len_i   <= min(L_max, k2 + 2G + 1) for every rollout that is not eps-kept (the gate's caps)
  E[budgeted tokens | plan] = sum_q n_q E[budgeted length of q]  ~= planned <= B  (L_q calibrated)
and generated = budgeted + the eps-kept rollouts' excess (logged as duet/eps_kept_excess_tokens).

Multi-turn episodes (`rollout.env`). A rollout's cost is the tokens the policy generated in all its turns
(`slime_ext.envs.samples.generated_tokens`): observation tokens are the environment's, appended without a
decode step, so neither B, L_q nor the metrics count them. The gate is not run: it is a per-request sampler
whose position, marker window and coin stream would restart every turn, and the answer it waits for is the
final turn's, which earlier turns (tool calls) cannot show. So every episode is kept (p_keep 1, weight
1 / s_pre) and L_q is the mean generated length of whole episodes; the gate's keys are config errors there
(`DuetConfig.check_run`).
"""

from __future__ import annotations

import math
import time
from statistics import mean
from typing import Any, Optional

from sglang_patches.duet import gate_drawn_at, gate_outcome
from slime_ext.methods.duet.allocation import bisect_allocation, knapsack_allocation, stratification_factors
from slime_ext.methods.duet.stats import LengthWindow, PromptStats, unbiasing_weight, within_step_sigma
from slime_ext.config.schema import Config
from slime_ext.data import Sample
from slime_ext.envs.samples import generated_tokens
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo.method import GRPO

MARKER_TASK = {"math": "math", "code": "code", "multiple_choice": "qa"}  # reward.type -> the gate's marker
# The allocator needs s_q > 0. The frozen floor (5th percentile of sigma_q after the first epoch) is 0
# when over 5% of prompts only had zero-variance groups (all right or all wrong); the paper's
# n_q = clip(round(0 / sqrt(lambda L_q)), n_min, n_max) = n_min for them, which this tiny s reproduces
# (unless the budget lets every other prompt saturate at n_max).
MIN_SIGNAL = 1e-9


def prompt_key(row: dict) -> str:
    return str(row.get("row_id", row.get("id", row["prompt"])))


def allocation_by_level(groups: list[list[Sample]]) -> dict[str, float]:
    """`duet/n_mean/<level>`: the mean rollouts per prompt of each task level in the step (rows that carry a level,
    as the synthetic tasks' do): where the allocation sends the budget on a mixed-level pool."""
    counts: dict[str, list[int]] = {}
    for group in groups:
        level = group[0].metadata.get("level") if group else None
        if level is not None:
            counts.setdefault(str(level), []).append(len(group))
    return {f"duet/n_mean/{level}": mean(n) for level, n in sorted(counts.items())}


class Duet(GRPO):
    name = "duet"

    def __init__(self, config: Config, tokenizer: Optional[Any] = None):
        super().__init__(config, tokenizer)
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
        s = [max(self.stats.s(k), MIN_SIGNAL) for k in keys]
        lengths = [self.stats.L(k) for k in keys]
        budget = self.budget(lengths)
        if d.allocator == "knapsack":
            alloc = knapsack_allocation(s, lengths, budget, d.n_min, d.n_max, d.knapsack_time_limit_s)
        else:
            alloc = bisect_allocation(s, lengths, budget, d.n_min, d.n_max, d.bisection_iters, lam_init=self.lam)
        if math.isfinite(alloc.lam) and alloc.lam > 0:
            self.lam = alloc.lam
        spec = {"kind": "duet_gate", "k1": self.window.k1, "k2": self.window.k2, "grace": d.grace, "poll": d.poll,
                "window": d.marker_window, "eps_abort": d.eps_abort, "task": self.task, "trim_entropy": d.trim_entropy}
        self._step_info = {"budget": budget, "keys": keys, "n": alloc.n, "k1": self.window.k1, "k2": self.window.k2,
                           "lam": alloc.lam, "saturated": alloc.saturated, "planned": alloc.cost,
                           "fallback": alloc.fallback,
                           "plan_s": time.perf_counter() - t0}
        gate = [] if self.config.rollout.env is not None else [dict(spec)]  # no gate across turns (module doc)
        return [PromptPlan(n, self.sampling, list(gate)) for n in alloc.n]

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        samples = [s for g in groups for s in g]
        for s in samples:
            notes = s.metadata.get("annotations") or []
            did_abort, propensity, marker = gate_outcome(notes)
            drawn = gate_drawn_at(notes)
            eps_kept = drawn is not None and not did_abort
            n = generated_tokens(s)  # the response, or an episode's generated tokens of every turn
            s.metadata.update(did_abort=did_abort, keep_propensity=propensity, marker_at=marker, eps_kept=eps_kept,
                              generated_len=n, budgeted_len=min(n, drawn + 1) if eps_kept else n)
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
                    natural.append(s.metadata["generated_len"])
            sigma = within_step_sigma([s.advantage for s in kept], [self.trained_logprob_sum(s) for s in kept])
            self.stats.observe(keys[q], sigma, [s.metadata["budgeted_len"] for s in group])
        self.window.add(natural)
        info = self._step_info
        generated = sum(s.metadata["generated_len"] for s in samples)
        budgeted = sum(s.metadata["budgeted_len"] for s in samples)
        weights = [s.weight for s in samples if not s.metadata["did_abort"]]
        metrics.update(allocation_by_level(groups))
        metrics.update({
            "duet/lambda": info.get("lam", float("nan")), "duet/k1": info.get("k1", 0), "duet/k2": info.get("k2", 0),
            "duet/budget_tokens": info.get("budget", float("nan")), "duet/generated_tokens": generated,
            "duet/tokens_over_budget": generated / info["budget"] if info.get("budget") else float("nan"),
            "duet/planned_tokens": info.get("planned", float("nan")), "duet/budgeted_tokens": budgeted,
            # 1.0: the exact knapsack ran out of time and the step used the LP relaxation's allocation
            "duet/allocator_fallback": float(info.get("fallback", False)),
            "duet/eps_kept_excess_tokens": generated - budgeted,
            "duet/eps_kept_rate": mean(s.metadata["eps_kept"] for s in samples),
            "duet/abort_rate": mean(s.metadata["did_abort"] for s in samples),
            "duet/marker_rate": mean(s.metadata["marker_at"] is not None for s in samples),
            # the gate ended the rollout after its answer marker: the tail after the answer was cut
            "duet/tail_trim_rate": mean(s.metadata["marker_at"] is not None and not s.metadata["did_abort"]
                                        and s.metadata.get("finish_reason") == "sampler" for s in samples),
            "duet/mean_is_weight": mean(weights) if weights else 0.0,
            "duet/n_min": min(len(g) for g in groups), "duet/n_max": max(len(g) for g in groups),
            "duet/n_mean": mean(len(g) for g in groups), "duet/rollouts": len(samples),
            "duet/s_floor": self.stats.floor,
            "time/controller": info.get("plan_s", 0.0) + time.perf_counter() - t0,
        })
        return metrics

    def trained_logprob_sum(self, sample: Sample) -> float:
        """sum_l log pi(y_l) over the tokens the loss trains (sigma_q's A x sum log pi); all of them here."""
        return sum(sample.logprobs or [0.0])

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
