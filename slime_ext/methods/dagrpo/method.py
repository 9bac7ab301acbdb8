"""DA-GRPO (docs/methods/dagrpo.md) and its fixed-reward baseline (collab_grpo).

plan:   the help-trigger sampler on every request (the local response ends at the trigger).
finish: per group, one cloud call if any response asked; the completion is spliced into every
        help-seeking response (local tokens trained, cloud tokens masked); the composed text is scored
        with the format rule; cost c = asked; advantages are the dual advantages with the current
        lambda (DA-GRPO) or GRPO advantages of r + hierarchical_reward x asked-and-correct... (collab).
update: lambda <- max(0, lambda + eta (C_hat - tau_t)); lambda is saved with checkpoints.

The cloud as a tool (`rollout.env: tools` offering `cloud`, `cloud_tool.py`): no sampler; the episode asks by
calling the tool, which answers with the cloud's completion (one call per group and step, as above) as an
observation the model reads before its next turn. finish reads c from the episode's tool calls and scores
the model's own text of all turns (`episodes.py`); reward, cost, advantages and lambda are the same functions.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from statistics import mean
from typing import Any, Optional

from slime_ext.algo import grouped_advantages
from slime_ext.config.schema import Config
from slime_ext.methods.dagrpo.cloud import CloudHelper, CloudTally, warn_if_cloud_degraded
from slime_ext.methods.dagrpo.cloud_tool import NAME as CLOUD_TOOL
from slime_ext.methods.dagrpo.continual import evaluate_phases
from slime_ext.methods.dagrpo.core import (composed_reward, dual_advantages, dual_update, format_ok, splice, spliced_routing,
                                           tau_at, with_trigger_examples)
from slime_ext.methods.dagrpo.episodes import asked_cloud, cloud_answered, model_text, turn_records
from slime_ext.data import Sample, SampleStatus
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo.method import GRPO
from slime_ext.rewards import ReasonCounter

log = logging.getLogger(__name__)
STUCK_STEPS = 3  # steps without a group split on asking before the run log says so


def load_phase_rows(config: Config, index: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of DA-GRPO phase `index`: its JSONL files, or synthetic math at its levels."""
    phase = config.dagrpo.phases[index]
    return load_rows(config, list(phase.levels), phase.train_path, phase.eval_path)


def phase_data_sources(config: Config) -> list[str]:
    """The distinct data sources of the phases, sorted: one per synthetic level, one per JSONL pair. A phase
    that mixes levels adds no source of its own, so it shares the warm start of the phases that use its
    levels one at a time (a mixed level set is round-robin over the same per-level streams)."""
    sources = set()
    for p in config.dagrpo.phases:
        if p.train_path:
            sources.add(json.dumps([p.levels, p.train_path, p.eval_path]))
        else:
            sources.update(json.dumps([[level], None, None]) for level in p.levels)
    return sorted(sources)


def load_source_rows(config: Config, source: str) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of one entry of `phase_data_sources`."""
    levels, train_path, eval_path = json.loads(source)
    return load_rows(config, levels, train_path, eval_path)


def load_rows(config: Config, levels: list[str], train_path: Optional[str] = None,
              eval_path: Optional[str] = None) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of JSONL files, or of synthetic math at `levels`, under the config's data settings."""
    from slime_ext.methods.registry import data_transform
    from slime_ext.tasks.prepare import prepare_data

    data_cfg = config.data.model_copy(deep=True)
    if train_path:
        data_cfg.source, data_cfg.train_path, data_cfg.eval_path = "jsonl", train_path, eval_path
    else:
        data_cfg.synthetic.train_levels = list(levels)
        data_cfg.synthetic.train_level_weights = None  # a phase's levels come in equal shares
        data_cfg.synthetic.eval_levels = list(levels)
    prepared = prepare_data(data_cfg, config.run.cache_dir, data_transform(config))
    return prepared.train, prepared.eval


def _rate_by_level(levels: list[Optional[str]], asked: list[bool], prefix: str) -> dict[str, float]:
    """The cloud rate per task level when a phase mixes levels: whether the policy learned *where* to ask."""
    names = sorted({lvl for lvl in levels if lvl is not None})
    if len(names) < 2:
        return {}
    return {f"{prefix}{name}": mean(float(a) for lvl, a in zip(levels, asked) if lvl == name) for name in names}


def cloud_client(d: Any) -> Any:
    """The OpenAI client for `dagrpo.cloud_url` with the configured timeout, retries, concurrency and breaker."""
    from slime_ext.clients.circuit_breaker import CircuitBreaker
    from slime_ext.clients.openai_client import OpenAIClient

    breaker = CircuitBreaker(d.cloud_breaker_failures, d.cloud_breaker_cooldown_s)
    return OpenAIClient(d.cloud_url, timeout_s=d.cloud_timeout_s, max_retries=d.cloud_retries,
                        max_concurrency=d.cloud_concurrency, breaker=breaker)


class DAGRPO(GRPO):
    name = "dagrpo"

    def __init__(self, config: Config, tokenizer: Optional[Any] = None, cloud: Optional[CloudHelper] = None):
        super().__init__(config, tokenizer)
        if tokenizer is None:
            raise ValueError("DA-GRPO needs the tokenizer (to splice the cloud's completion)")
        d = config.dagrpo
        self.tokenizer = tokenizer
        self.lam = float(d.lambda_init)
        self.phase_index, self.step_in_phase = 0, 0
        self._unsplit_steps = 0  # consecutive steps with no group split on asking (for the run log)
        self.spec = {"kind": "dagrpo_trigger", "trigger": d.trigger}
        if cloud is None and d.local_only:
            cloud = CloudHelper(None)  # never called: nothing asks
        if cloud is None:
            if not d.cloud_url:
                raise ValueError("DA-GRPO needs dagrpo.cloud_url (an OpenAI-compatible endpoint, e.g. "
                                 "python -m slime_ext.tools.serve --model STRONGER_MODEL, or solver:synthetic_math)")
            if d.cloud_url.startswith("solver:"):
                raise ValueError(f"dagrpo.cloud_url={d.cloud_url}: a solver endpoint is started by the process that "
                                 "builds the method (slime_ext.orchestration.local_endpoints.build_run_method)")
            cloud = CloudHelper(cloud_client(d), max_tokens=config.rollout.max_response_len)
        self.cloud = cloud

    @property
    def phase(self) -> Any:
        phases = self.config.dagrpo.phases
        return phases[min(self.phase_index, len(phases) - 1)] if phases else None

    def tau(self) -> float:
        p = self.phase
        return tau_at(self.step_in_phase, p.tau, p.tau_schedule) if p is not None else 0.0

    @property
    def tool_path(self) -> bool:
        """Multi-turn episodes (`rollout.env`): the model asks by calling the `cloud` tool, no trigger sampler
        (config validation requires the tool there, unless local_only)."""
        return self.config.rollout.env is not None

    def cloud_tool(self) -> Any:
        """The `cloud` tool this method lends to the `tools` environment (one object per process)."""
        return self.env_tools()[CLOUD_TOOL]

    # -- the warm start: every phase's data, some solutions ending in the help trigger ------------------
    def warm_start_key(self) -> Any:
        """The SFT rows depend on the phases' data only (not their order, steps, tau or local_only), so
        every arm of a study over the same tasks shares one warm start."""
        d = self.config.dagrpo
        key = (phase_data_sources(self.config), d.trigger, d.sft_trigger_fraction)
        return key + (CLOUD_TOOL,) if self.tool_path else key  # the tool path's rows ask by a call

    def warm_start_rows(self, train_rows: list[dict], seed: int) -> list[dict]:
        d = self.config.dagrpo
        if not d.phases:
            return train_rows
        rows = [r for source in phase_data_sources(self.config) for r in load_source_rows(self.config, source)[0]]
        return with_trigger_examples(rows, d.trigger, d.sft_trigger_fraction, seed,
                                     tool=CLOUD_TOOL if self.tool_path else None)

    def evaluate_after_step(self, row: dict[str, float], engine: Any, run_dir: Path) -> None:
        """After each phase: every phase's held-out set, then the continual table so far."""
        if row.get("dagrpo/phase_end"):
            evaluate_phases(self, engine, int(row.get("dagrpo/phase", 0)), run_dir)

    # -- continual phases ----------------------------------------------------------------------------
    def data_phase(self) -> Optional[str]:
        return self.phase.name if self.phase is not None else None

    def phase_rows(self, index: int) -> tuple[list[dict], list[dict]]:
        """(train, held-out) rows of phase `index` (cached per method)."""
        cache = getattr(self, "_phase_rows", {})
        self._phase_rows = cache
        if index not in cache:
            cache[index] = load_phase_rows(self.config, index)
        return cache[index]

    def phase_train_rows(self, name: str) -> list[dict]:
        index = [p.name for p in self.config.dagrpo.phases].index(name)
        return self.phase_rows(index)[0]

    def evaluate_rows(self, engine: Any, rows: list[dict], template: str, seed: int = 0,
                      baselines: bool = True, records: Optional[list[dict]] = None,
                      temperature: float = 0.0) -> dict[str, float]:
        """Local answers with the trigger (or episodes with the cloud tool), greedy unless `temperature` > 0; the
        cloud answers the prompts that asked (one call each); joint accuracy (composed), local-only accuracy
        (prompts kept local), cloud rate. `records`, when given, receives one record per prompt (id, level, asked,
        cloud answered, correct, length: the tokens the local model generated)."""
        from sglang_patches.decoding import SamplingParams
        from slime_ext.data.generation import GenerateRequest
        from slime_ext.tasks.templates import get_template

        fmt = get_template(template)
        sp = SamplingParams(temperature=temperature, max_new_tokens=self.config.rollout.max_response_len)
        reqs = [GenerateRequest(f"dg-eval-{i}", self.tokenizer(fmt.format(r["prompt"]))["input_ids"], sp, seed + i,
                                self.specs(), return_logprob=False) for i, r in enumerate(rows)]
        answer = self._episode_answers if self.tool_path else self._spliced_answers
        asked, texts, completions, tally, lengths = answer(engine, reqs, rows)
        correct, local = [], []
        for row, a, cloud_text, text, length in zip(rows, asked, completions, texts, lengths):
            ok = float(self.verify(text, row["label"]).score > 0)
            correct.append(ok)
            if not a:
                local.append(ok)
            if records is not None:
                records.append({"prompt_id": str(row.get("id", len(records))), "level": row.get("level"),
                                "asked": bool(a), "cloud_answered": bool(a and cloud_text is not None),
                                "correct": ok, "length": length})
        out = {"joint_accuracy": mean(correct), "local_only_accuracy": mean(local) if local else float("nan"),
               "cloud_rate": mean(asked), "n": float(len(rows))}
        out.update(_rate_by_level([r.get("level") for r in rows], asked, "cloud_rate/"))
        if baselines and rows and not self.config.dagrpo.local_only:
            baseline_metrics, baseline_tally = self._router_baselines(rows, correct, asked, completions, seed)
            out.update(baseline_metrics)
            tally = tally + baseline_tally
        out.update(tally.as_dict("cloud_"))  # cloud_calls, cloud_failures, cloud_skipped, cloud_failure_rate
        return out

    def _spliced_answers(self, engine: Any, reqs: list[Any], rows: list[dict]) -> tuple:
        """(asked, scored texts, cloud completions, tally, lengths) of one response per request: the trigger ends
        it, and the cloud's completion takes the trigger's place."""
        results = engine.generate(reqs)
        asked = [any(a.get("asked_for_help") for a in res.annotations) for res in results]
        completions, tally = self.cloud.ask([r["prompt"] if a else None for r, a in zip(rows, asked)])
        eos = self.tokenizer.eos_token_id
        texts = []
        for res, a, cloud_text in zip(results, asked, completions):
            text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
            if a:
                text = splice(res.output_ids, text, self.config.dagrpo.trigger, cloud_text, self.tokenizer, eos).scored_text
            texts.append(text)
        return asked, texts, completions, tally, [len(res.output_ids) for res in results]

    def _episode_answers(self, engine: Any, reqs: list[Any], rows: list[dict]) -> tuple:
        """The same from one episode per request of the run's environment, the cloud a tool (`rollout.env`)."""
        from slime_ext.envs.registry import build_env
        from slime_ext.envs.rollout import EpisodeLimits, run_episodes

        r = self.config.rollout
        env = build_env(r.env, r.env_settings, self.tokenizer, self.env_tools())
        tool = self.cloud_tool()
        tool.new_batch()
        episodes = run_episodes(engine.generate, reqs, rows, env, self.tokenizer, EpisodeLimits.of_rollout(r))
        turns = [e.stats()["turn_records"] for e in episodes]
        asked = [asked_cloud(t) for t in turns]
        answers = tool.answers()
        completions = [answers.get(str(row["prompt"])) if a else None for row, a in zip(rows, asked)]
        texts = [model_text(e.response_ids, t, self.tokenizer) for e, t in zip(episodes, turns)]
        return asked, texts, completions, tool.tally(), [e.generated_tokens for e in episodes]

    def _router_baselines(self, rows: list[dict], correct: list[float], asked: list[bool],
                          completions: list[Optional[str]], seed: int) -> tuple[dict[str, float], CloudTally]:
        """Random router and a router classifier at DA-GRPO's own cloud rate, on the same prompts: the
        local answer where kept (a prompt where the model asked counts as a local failure), the cloud's
        where routed. The classifier is cross-fitted (two folds) on the prompts' features. Reuses the
        evaluation's scores and cloud answers; only prompts that did not ask go to the cloud here."""
        import numpy as np

        from slime_ext.methods.dagrpo.routers import (LogisticRouter, prompt_features, random_route, route_by_score,
                                              routed_scores)

        local = np.array([0.0 if a else ok for ok, a in zip(correct, asked)])
        missing, tally = self.cloud.ask([None if a else row["prompt"] for row, a in zip(rows, asked)])
        cloud_texts = [c if a else m for c, m, a in zip(completions, missing, asked)]
        cloud = np.array([float(t is not None and self.verify(t, row["label"]).score > 0) for row, t in zip(rows, cloud_texts)])
        feats = np.stack([prompt_features(row["prompt"]) for row in rows])
        scores = np.zeros(len(rows))
        folds = np.arange(len(rows)) % 2
        for f in (0, 1):
            train, test = folds != f, folds == f
            if len(set((1 - local[train]).tolist())) < 2:
                scores[test] = 0.5  # nothing to learn from one class
                continue
            scores[test] = LogisticRouter().fit(feats[train], 1 - local[train]).predict_proba(feats[test])
        rate = mean(asked)
        rnd = routed_scores(local, cloud, random_route(len(rows), rate, seed))
        clf = routed_scores(local, cloud, route_by_score(scores, rate))
        return {"random_router_joint_accuracy": rnd["joint_accuracy"], "router_clf_joint_accuracy": clf["joint_accuracy"],
                "cloud_alone_accuracy": float(cloud.mean()), "local_alone_accuracy": float(local.mean())}, tally

    def specs(self) -> list[dict]:
        """The trigger sampler, except for the local-only baseline and on the tool path (no sampler: the
        episode asks by calling the cloud tool)."""
        return [] if self.config.dagrpo.local_only or self.tool_path else [dict(self.spec)]

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        n = self.config.rollout.n_samples_per_prompt
        if self.tool_path:
            self.cloud_tool().new_batch()  # one cloud call per prompt group and step
        return [PromptPlan(n, self.sampling, self.specs()) for _ in prompts]

    def score(self, groups: list[list[Sample]]) -> ReasonCounter:
        d = self.config.dagrpo
        limit = self.phase.step_limit if self.phase is not None else 4
        reasons = ReasonCounter()
        asked, texts, tally = self._asked_from_episodes(groups) if self.tool_path else self._splice_cloud(groups)
        self._step = {"groups": len(groups), "tally": tally}
        for group, flags, group_texts in zip(groups, asked, texts):
            for s, a, text in zip(group, flags, group_texts):
                s.cost = 1.0 if a else 0.0
                s.response_text = text
                if s.status == SampleStatus.FAILED:
                    s.reward = 0.0
                    continue
                result = self.verify(text, s.label)
                correct = result.score > 0
                s.rewards.update(correct=float(correct), format=float(format_ok(text, limit, d.require_tags)))
                s.reward = composed_reward(correct, bool(s.rewards["format"]), d.badly_formatted_reward)
                reasons.add(result)
        return reasons

    def _splice_cloud(self, groups: list[list[Sample]]) -> tuple[list[list[bool]], list[list[str]], CloudTally]:
        """(asked, scored texts, the step's cloud calls) of single responses: one call per group that asked, its
        completion spliced into every response that asked (local tokens trained, cloud tokens masked)."""
        d = self.config.dagrpo
        eos = self.tokenizer.eos_token_id
        asked = [[any(n.get("asked_for_help") for n in (s.metadata.get("annotations") or [])) for s in g] for g in groups]
        questions = [g[0].metadata.get("question") if any(a) else None for g, a in zip(groups, asked)]
        completions, tally = self.cloud.ask(questions)
        texts = []
        for group, flags, cloud_text in zip(groups, asked, completions):
            texts.append([])
            for s, a in zip(group, flags):
                text = s.response_text or ""
                if a:
                    sp = splice(s.response_ids, self.tokenizer.decode(s.response_ids, skip_special_tokens=True),
                                d.trigger, cloud_text, self.tokenizer, eos)
                    local = len([t for t in s.response_ids if t != eos])
                    lps = (s.logprobs or [0.0] * s.response_len)[:local]
                    s.routed_experts = spliced_routing(s.routed_experts, len(s.prompt_ids), s.response_ids, eos,
                                                       len(sp.response_ids))
                    s.response_ids, s.loss_mask, s.author = sp.response_ids, sp.loss_mask, sp.author
                    s.logprobs = lps + [0.0] * (len(sp.response_ids) - local)
                    s.metadata.update(asked=True, cloud_answered=cloud_text is not None)
                    text = sp.scored_text
                texts[-1].append(text)
        return asked, texts, tally

    def _asked_from_episodes(self, groups: list[list[Sample]]) -> tuple[list[list[bool]], list[list[str]], CloudTally]:
        """(asked, scored texts, the step's cloud calls) of episodes: asked is a cloud call among the episode's
        tool calls, the text is the model's own of every turn; the tool made the calls while the episodes ran."""
        asked, texts = [], []
        for group in groups:
            records = [turn_records(s) for s in group]
            asked.append([asked_cloud(t) for t in records])
            texts.append([model_text(s.response_ids, t, self.tokenizer) for s, t in zip(group, records)])
            for s, t, a in zip(group, records, asked[-1]):
                if a:
                    s.metadata.update(asked=True, cloud_answered=cloud_answered(t))
        return asked, texts, self.cloud_tool().tally()

    def advantages(self, samples: list[Sample]) -> list[float]:
        g = self.config.grpo
        return dual_advantages([s.reward for s in samples], [s.cost for s in samples], [s.group_id for s in samples],
                               self.lam, normalize_std=g.normalize_std, eps=g.adv_eps).tolist()

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        reasons = self.score(groups)
        samples = [s for g in groups for s in g]
        for s, a in zip(samples, self.advantages(samples)):
            s.advantage = a
            if s.status == SampleStatus.FAILED:
                s.loss_mask, s.advantage = [0.0] * s.response_len, 0.0
        rate = mean(s.cost for s in samples)
        metrics = {
            "reward/mean": mean(s.reward for s in samples), "reward/correct": mean(s.rewards.get("correct", 0) for s in samples),
            "reward/format": mean(s.rewards.get("format", 0) for s in samples),
            "dagrpo/lambda": self.lam, "dagrpo/tau": self.tau(), "dagrpo/cloud_rate": rate,
            "dagrpo/cloud_calls_per_group": self._step["tally"].calls / max(self._step["groups"], 1),
            # groups where some asked and some did not: the only ones whose cost advantage is non-zero (at
            # 0 the dual variable has no lever left on the policy: asking always or never is absorbing)
            "dagrpo/groups_split_on_asking": mean(float(0 < sum(s.cost for s in g) < len(g)) for g in groups),
            **self._step["tally"].as_dict("dagrpo/cloud_"),  # calls, failures, skipped, failure_rate
            "dagrpo/local_only_accuracy": mean([s.rewards.get("correct", 0) for s in samples if not s.cost] or [float("nan")]),
            "dagrpo/phase": float(self.phase_index),
            "response_len/mean": mean(s.response_len for s in samples),
        }
        metrics.update(_rate_by_level([s.metadata.get("level") for s in samples], [bool(s.cost) for s in samples],
                                      "dagrpo/cloud_rate/"))
        for reason, count in reasons.as_dict().items():
            metrics[f"verifier/{reason}"] = count / len(samples)
        metrics["dagrpo/cloud_degraded"] = float(warn_if_cloud_degraded(
            self._step["tally"], self.config.dagrpo.cloud_failure_warn_rate, f"step {step}"))
        self._last_rate = rate
        self._unsplit_steps = 0 if metrics["dagrpo/groups_split_on_asking"] > 0 else self._unsplit_steps + 1
        if self._unsplit_steps == STUCK_STEPS and self.name == "dagrpo" and not self.config.dagrpo.local_only:
            log.warning("DA-GRPO step %d: for %d steps no prompt group was split on asking (cloud rate %.2f), so "
                        "the cost advantage is zero and lambda (%.2f) cannot move the policy; a KL anchor "
                        "(grpo.kl_coef) or a slower dual (dagrpo.eta_lambda) avoids this (docs/methods/dagrpo.md)",
                        step, STUCK_STEPS, rate, self.lam)
        return metrics

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        """The projected dual step with this step's cloud rate, then advance the phase clock."""
        rate = getattr(self, "_last_rate", 0.0)
        self.lam = dual_update(self.lam, rate, self.tau(), self.config.dagrpo.eta_lambda)
        self.step_in_phase += 1
        phases = self.config.dagrpo.phases
        ended = bool(phases) and self.step_in_phase >= phases[min(self.phase_index, len(phases) - 1)].steps
        out = {"dagrpo/lambda_next": self.lam, "dagrpo/phase_end": float(ended)}
        if ended and self.phase_index < len(phases) - 1:
            self.phase_index, self.step_in_phase = self.phase_index + 1, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"lambda": self.lam, "phase_index": self.phase_index, "step_in_phase": self.step_in_phase}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.lam = float(state["lambda"])
            self.phase_index, self.step_in_phase = int(state["phase_index"]), int(state["step_in_phase"])


class CollabGRPO(DAGRPO):
    """Baseline: no dual variable; a fixed assistance reward (`dagrpo.hierarchical_reward`) for a correct
    answer reached with the cloud's help, instead of the full reward (hierarchical: solving alone pays
    more than solving with help)."""

    name = "collab_grpo"

    def score(self, groups: list[list[Sample]]) -> ReasonCounter:
        reasons = super().score(groups)
        for g in groups:
            for s in g:
                if s.cost and s.rewards.get("correct"):
                    s.reward = float(self.config.dagrpo.hierarchical_reward)
        return reasons

    def advantages(self, samples: list[Sample]) -> list[float]:
        g = self.config.grpo
        return grouped_advantages([s.reward for s in samples], [s.group_id for s in samples],
                                  normalize_std=g.normalize_std, eps=g.adv_eps).tolist()

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        lam = self.lam
        out = super().update(stats, step)
        self.lam = lam  # the baseline keeps lambda fixed (its initial value)
        return out
