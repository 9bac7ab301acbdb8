"""The rollout manager: prompts -> method plan -> engine requests -> samples -> method finish.

Runs as a Ray actor in the training loop (`RemoteRolloutManager` is the driver's synchronous handle;
`rollout.manager=driver` keeps it in the driver process) or as a plain object in tests. It owns the data source,
the tokenizer, and, during RL, the run's one method object (its controllers), and talks to the engine through
the engine interface, so the same code drives the embedded engine and SGLang servers.

The method is handed over by `TrainingJob` when the manager is made (the same object in the driver process,
pickled into the actor) and handed back by `release_method` when RL ends; in between, the driver reaches the
method only through the manager: `loss_spec` (the step's loss, asked with the rollout), `update`,
`state_dict`, `evaluate_after_step`. So the controllers' state the loop sees is the state that made the rollouts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from pathlib import Path
from typing import Any, Optional

import torch

from slime_ext.algo import LossSpec
from slime_ext.config.schema import Config
from slime_ext.data import Sample, SampleStatus
from slime_ext.data.generation import GenerateRequest, GenerateResult, continuation_request
from slime_ext.engine.failures import StaleRollout
from slime_ext.envs.metrics import episode_metrics
from slime_ext.envs.registry import build_env
from slime_ext.envs.rollout import EpisodeLimits, EpisodeResult, run_episodes
from slime_ext.envs.samples import apply_episode
from slime_ext.methods.base import Method
from slime_ext.orchestration.local_endpoints import build_run_method
from slime_ext.orchestration.data_source import DataSource
from slime_ext.tasks.dataset import LoadReport
from slime_ext.tasks.lengths import LengthLimits, PromptTooLong, drop_too_long
from slime_ext.tasks.templates import get_template

# A rollout metrics key holding the engine restart events of the step (a list, not a number): the driver
# takes it out of the row, prints the restarts and appends them to `<run dir>/engine_events.jsonl`.
ENGINE_EVENTS_KEY = "_engine_events"

STATUS_BY_FINISH = {
    "stop": SampleStatus.COMPLETED,
    "sampler": SampleStatus.COMPLETED,
    "length": SampleStatus.TRUNCATED,
    "abort": SampleStatus.ABORTED,
    "failed": SampleStatus.FAILED,
}


def request_seed(run_seed: int, step: int, prompt: int, sample: int) -> int:
    """A per-request seed that is a pure function of its coordinates (resume-safe, batching-free)."""
    digest = hashlib.blake2b(f"{run_seed}:{step}:{prompt}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF


def check_weight_versions(requests: list[GenerateRequest], results: list[GenerateResult], step: int) -> None:
    """Step t's rollouts must come from version t (engines that report versions: servers; the embedded
    engine reports none). A mismatch means an engine missed a sync: never train on it."""
    stale = [(q.rid, r.weight_version) for q, r in zip(requests, results)
             if r.weight_version is not None and r.finish_reason != "failed" and r.weight_version != str(step)]
    if stale:
        raise StaleRollout(f"step {step}: {len(stale)} rollout(s) were generated with weight versions other than "
                           f"{step}, e.g. {stale[:3]} (rid, version); an engine missed a weight sync")


def check_token_versions(requests: list[GenerateRequest], versions: list[list[int]], rollout: int,
                         started: int) -> None:
    """Asynchronous runs: no token of a rollout may be older than the version the engines served when it
    started (older: an engine missed a weight sync). The bound against the step that trains it is the
    loop's (slime_ext.orchestration.async_rollouts)."""
    stale = [(q.rid, sorted(set(v))) for q, v in zip(requests, versions) if any(x < started for x in v)]
    if stale:
        raise StaleRollout(f"rollout {rollout}: {len(stale)} request(s) hold tokens of weight versions older than "
                           f"{started}, the version the engines served when it started, e.g. {stale[:3]} (rid, "
                           "versions); an engine missed a weight sync")


@dataclasses.dataclass
class _Partial:
    """What a request generated so far across weight syncs (off-policy runs)."""

    request: GenerateRequest
    output_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    annotations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    first: Optional[GenerateResult] = None
    last: Optional[GenerateResult] = None
    routes: Any = None  # routed experts per position, each row from the call whose weights produced its token

    def add(self, res: GenerateResult, version: int) -> None:
        self.first = self.first or res
        self.last = res
        self.routes = stitch_routes(self.routes, res.routed_experts, len(self.request.input_ids) + len(self.output_ids))
        self.output_ids += res.output_ids
        self.logprobs += res.logprobs or []
        self.annotations += res.annotations or [{} for _ in res.output_ids]
        reported = res.token_versions  # per token, from engines that report them (paused across a sync)
        if reported is not None and all(v.isdigit() for v in reported):
            self.versions += [int(v) for v in reported]
        else:
            self.versions += [version] * len(res.output_ids)

    def continuation(self) -> Optional[GenerateRequest]:
        """Prompt + partial response as the input, the rest of the token budget, the same rid, samplers and
        flags (logprobs, routed experts)."""
        return continuation_request(self.request, self.output_ids)

    def result(self, finish_reason: Optional[str] = None) -> GenerateResult:
        last, q = self.last, self.request
        return GenerateResult(
            rid=q.rid, output_ids=list(self.output_ids),
            logprobs=list(self.logprobs) if q.return_logprob and last.logprobs is not None else None,
            finish_reason=finish_reason or last.finish_reason, annotations=list(self.annotations),
            cached_tokens=self.first.cached_tokens, prompt_len=len(q.input_ids), error=last.error,
            weight_version=last.weight_version, served_by=last.served_by, routed_experts=self.routes)


def stitch_routes(kept: Any, new: Any, cut: int) -> Any:
    """Routing replay across a weight sync: the routes of a continued request (input = the prompt and the
    `cut - prompt` tokens generated before the sync) cover every position again, but the engine recomputed
    the earlier ones under the new weights. Row i holds the routes of the forward at position i, which
    produced token i + 1: rows before `cut - 1` produced tokens of the old version and keep the old call's
    routes (pairing them with the new call's would train old-version logprobs on new-version routes); rows
    from `cut - 1` on come from the call that produced their tokens."""
    if kept is None or new is None:
        return new if kept is None else kept
    head = cut - 1
    if isinstance(new, torch.Tensor):
        return torch.cat([kept[:head], new[head:]], dim=0)
    return list(kept[:head]) + list(new[head:])


def restart_metrics(engine: Any, step: int) -> dict[str, Any]:
    """`engine/restarts` and `engine/resent_requests` since the last step (0 for an engine that cannot
    restart, e.g. the embedded one), plus the restart events under ENGINE_EVENTS_KEY when there were any.
    Restarts happen in this process (the rollout manager actor, whose log the driver does not show), so
    they travel to the driver with the step's metrics."""
    take = getattr(engine, "take_restart_report", None)
    report = take() if callable(take) and getattr(take, "remote", None) is None else {}
    out: dict[str, Any] = {"engine/restarts": float(report.get("restarts", 0)),
                           "engine/resent_requests": float(report.get("resent_requests", 0))}
    events = report.get("events") or []
    if events:
        out[ENGINE_EVENTS_KEY] = [{**e, "step": step} for e in events]
    return out


def version_metrics(results: list[GenerateResult]) -> dict[str, float]:
    """The weight versions and the number of engine servers behind a step's rollouts (servers only)."""
    versions = [int(r.weight_version) for r in results if r.weight_version is not None and r.weight_version.isdigit()]
    out: dict[str, float] = {}
    if versions:
        out.update({"rollout/weight_version_min": min(versions), "rollout/weight_version_max": max(versions)})
    servers = {r.served_by for r in results if r.served_by}
    if servers:
        out["rollout/engines_used"] = len(servers)
    return out


class RolloutManager:
    """Rollouts, scored by the method it holds (see the module docstring for who holds the method when)."""

    def __init__(self, config: Config, train_rows: list[dict], tokenizer: Any, engine: Any,
                 method: Optional[Method] = None, scorer: Optional[Any] = None):
        """`method`: the run's method object (`TrainingJob` hands it over); without one (tests, benchmarks)
        the manager builds its own from the config. `scorer`: the method's scoring servers (`ScoringPool`),
        which then score the sampled tokens in place of the engine's scoring model."""
        self.config = config
        self.tokenizer = tokenizer
        self.engine = engine
        self.scorer = scorer
        self.method: Optional[Method] = method if method is not None else build_run_method(config, tokenizer)
        self.data = DataSource(train_rows[: config.rollout.prompt_pool], config.run.seed, config.data.shuffle)
        self.template = get_template(config.data.template)
        self.phase_sources: dict[str, DataSource] = {}  # continual methods: one data order per phase
        self._pending_phase_states: dict[str, Any] = {}
        # Off-policy runs (slime_ext.orchestration.off_policy): the weight version the engine serves, and
        # the pause / resume handshake around a weight sync that arrives while a rollout is in flight.
        self._cv = threading.Condition()
        self._version = -1
        self._paused = False
        self._generating = False
        self._in_flight: set[str] = set()
        self._sync_aborted: set[str] = set()
        self._env: Any = None  # rollout.env's environment, built at the first multi-turn rollout

    def _source(self) -> DataSource:
        name = self.method.data_phase()
        if name is None:
            return self.data
        if name not in self.phase_sources:
            seed = self.config.run.seed + int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")
            source = DataSource(self._fitting(self.method.phase_train_rows(name), f"phase {name}"), seed,
                                self.config.data.shuffle)
            if name in self._pending_phase_states:
                source.load_state_dict(self._pending_phase_states.pop(name))
            self.phase_sources[name] = source
        return self.phase_sources[name]

    def _generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        return self._engine_call("generate", requests)

    def _fitting(self, rows: list[dict], what: str) -> list[dict]:
        """A method's own rows (a phase's data, loaded after the data stage) without the too-long ones."""
        report = LoadReport(path=f"{what} training rows", n_rows_ok=len(rows))
        return drop_too_long(rows, self.tokenizer, self.config.data.template, LengthLimits.from_config(self.config),
                             report)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The templated prompt's ids. Too-long rows were skipped when the data was prepared: one that
        still arrives is an error, never cut (a left-truncated question is a different question)."""
        ids = self.tokenizer(self.template.format(prompt))["input_ids"]
        limit = self.config.rollout.max_prompt_len
        if len(ids) > limit:
            raise PromptTooLong(f"a prompt of {len(ids)} tokens exceeds rollout.max_prompt_len={limit}; rows that "
                                f"long are skipped when the data is prepared, this one was not: {prompt[:80]!r}...")
        return ids

    def rollout(self, step: int, weight_version: Optional[int] = None) -> tuple[list[list[Sample]], dict[str, float]]:
        """One step's rollouts, scored and with advantages; plus metrics (including timings).

        Asynchronous runs (`rollout.max_staleness` >= 1) pass the `weight_version` the engine serves when the
        rollout starts (`step` is then the rollout's index, which seeds its requests): every token records its
        version (`Sample.token_versions`), see `_generate_versioned`."""
        off = self.config.rollout.asynchronous
        started = step if weight_version is None else weight_version  # the version the engines serve now
        t0 = time.perf_counter()
        source = self._source()
        self.method.data_epoch = source.epoch
        rows = source.next_batch(self.method.prompts_to_draw(self.config.rollout.prompts_per_step))
        plans = self.method.plan(rows, step)
        requests, where = [], []
        replay = self.config.train.routing_replay  # R3: the engine records routed experts for the trainer
        for i, (row, plan) in enumerate(zip(rows, plans)):
            ids = self.prompt_ids(row["prompt"])
            for j in range(plan.n):
                requests.append(GenerateRequest(f"s{step}-p{i}-k{j}", ids, plan.sampling,
                                                request_seed(self.config.run.seed, step, i, j), plan.sampler_specs,
                                                return_routed_experts=replay))
                where.append(i)
        episodes = None
        if self.config.rollout.env is not None:  # multi-turn episodes (slime_ext/envs)
            episodes, versions, resumed = self._episodes(requests, [rows[i] for i in where], step, started)
            results = [e.as_result() for e in episodes]
        elif off:
            results, versions, resumed = self._generate_versioned(requests, started)
            check_token_versions(requests, versions, step, started)
        else:
            results = self._generate(requests)
            check_weight_versions(requests, results, step)
        t1 = time.perf_counter()
        groups: list[list[Sample]] = [[] for _ in rows]
        for k, (req, res, i) in enumerate(zip(requests, results, where)):
            groups[i].append(self._to_sample(req, res, rows[i], step, i))
            if episodes is not None:
                apply_episode(groups[i][-1], episodes[k])
            if off:
                groups[i][-1].token_versions = versions[k]
        scorer = self.method.scoring_model()
        t_score = time.perf_counter()
        if scorer is not None:  # a model scores the sampled tokens (on-policy distillation's teacher)
            self._attach_scores([s for g in groups for s in g], scorer)
        t_score = time.perf_counter() - t_score
        metrics = self.method.finish(groups, step)
        if off:
            metrics.update(self._off_policy_tokens(groups, step, resumed))
        t2 = time.perf_counter()
        generated = sum(len(r.output_ids) for r in results) if episodes is None else \
            sum(e.generated_tokens for e in episodes)
        if episodes is not None:
            metrics.update(episode_metrics(episodes))
        if scorer is not None:
            metrics["time/score"] = t_score  # part of time/reward
        metrics.update({"time/rollout": t1 - t0, "time/reward": t2 - t1, "rollout/generated_tokens": generated,
                        "perf/rollout_tokens_per_s": generated / max(t1 - t0, 1e-9),
                        "rollout/failed": sum(r.finish_reason == "failed" for r in results) / len(results),
                        "rollout/epoch": source.epoch})
        metrics.update(version_metrics(results))
        metrics.update(restart_metrics(self.engine, step))
        return groups, metrics

    def _episodes(self, requests: list[GenerateRequest], rows: list[dict], step: int, started: int
                  ) -> tuple[list[EpisodeResult], Optional[list[list[int]]], int]:
        """Multi-turn episodes (`rollout.env`): one engine call per turn for every live episode, token-in,
        token-out (slime_ext/envs/rollout.py); the weight-version checks of the single-turn path over every turn.
        Returns (episodes, per-token versions and the number of turns continued after a weight sync (off-policy
        runs; else None, 0))."""
        r = self.config.rollout
        with_samplers = [q.rid for q in requests if q.sampler_specs]
        if with_samplers:
            raise ValueError(f"rollout.env = {r.env!r} but requests {with_samplers[:3]} carry per-request samplers, "
                             "whose state would restart every turn; multi-turn episodes take methods without samplers")
        if self._env is None:  # with the tools the method lends (registry `tools`), sharing its state
            self._env = build_env(r.env, r.env_settings, self.tokenizer, self.method.env_tools())
        calls: list[tuple[GenerateRequest, GenerateResult]] = []
        by_rid: dict[str, list[int]] = {}
        resumed = 0

        def generate(turn: list[GenerateRequest]) -> list[GenerateResult]:
            nonlocal resumed
            if r.asynchronous:
                results, versions, n = self._generate_versioned(turn, started)
                by_rid.update({q.rid: v for q, v in zip(turn, versions)})
                resumed += n
            else:
                results = self._generate(turn)
            calls.extend(zip(turn, results))
            return results

        episodes = run_episodes(generate, requests, rows, self._env, self.tokenizer, EpisodeLimits.of_rollout(r))
        if not r.asynchronous:
            check_weight_versions([q for q, _ in calls], [res for _, res in calls], step)
            return episodes, None, 0
        versions = [e.token_versions(by_rid) for e in episodes]
        check_token_versions(requests, versions, step, started)
        return episodes, versions, resumed

    # -- off-policy runs --------------------------------------------------------------------------
    def _generate_versioned(self, requests: list[GenerateRequest], version: int
                            ) -> tuple[list[GenerateResult], list[list[int]], int]:
        """Generate, recording the weight version of every token; (results, per-token versions, number of
        requests aborted by a weight sync and continued). A request that `pause_generation` aborted is
        continued after `resume_generation` with the new weights (prompt + partial response as input, the
        same rid and samplers, the rest of its token budget, a seed derived from its own and the cut); the
        engine's reported version wins over the tracked one where it reports one (servers)."""
        if self.config.rollout.partial_rollouts:
            with_samplers = [q.rid for q in requests if q.sampler_specs]
            if with_samplers:
                raise ValueError(f"rollout.partial_rollouts is true but requests {with_samplers[:3]} carry per-request "
                                 "samplers, whose state a continued request would lose; set "
                                 "rollout.partial_rollouts=false for this method")
        with self._cv:
            self._version = max(self._version, int(version))  # a resume that came first already moved it on
        partial = {q.rid: _Partial(q) for q in requests}
        final: dict[str, GenerateResult] = {}
        resumed: set[str] = set()
        pending = list(requests)
        while pending:
            with self._cv:
                while self._paused:
                    self._cv.wait()
                current = self._version
                self._in_flight = {q.rid for q in pending}
                self._generating = True
            try:
                results = self._generate(pending)
            finally:
                with self._cv:
                    self._generating = False
                    self._in_flight = set()
                    self._cv.notify_all()
            again = []
            for q, res in zip(pending, results):
                p = partial[q.rid]
                reported = res.weight_version
                p.add(res, int(reported) if reported is not None and reported.isdigit() else current)
                with self._cv:
                    by_sync = res.finish_reason == "abort" and q.rid in self._sync_aborted
                    self._sync_aborted.discard(q.rid)
                if not by_sync:
                    final[q.rid] = p.result()
                    continue
                resumed.add(q.rid)
                follow = p.continuation()
                if follow is None:
                    final[q.rid] = p.result("length")
                else:
                    again.append(follow)
            pending = again
        with self._cv:
            self._sync_aborted.clear()  # aborts that came after their request had finished
        return [final[q.rid] for q in requests], [partial[q.rid].versions for q in requests], len(resumed)

    def _attach_scores(self, samples: list[Sample], model: str) -> None:
        """The engine's `model` (or the scoring servers) scores each sample's exact token ids (prompt + response as
        sampled, prefill only, temperature 1): its logprob of every response token lands in `metadata["scored_logprobs"]`."""
        scored = [s for s in samples if s.response_ids]
        sequences, starts = [s.prompt_ids + s.response_ids for s in scored], [len(s.prompt_ids) for s in scored]
        if not scored:
            logprobs = []
        elif self.scorer is not None:  # servers of their own (the engine-server path's teacher)
            logprobs = self.scorer.score(sequences, starts)
        else:
            logprobs = self._engine_call("score", sequences, starts, model)
        for s in samples:
            s.metadata["scored_logprobs"] = []
        for s, lp in zip(scored, logprobs):
            s.metadata["scored_logprobs"] = list(lp)

    def _engine_call(self, name: str, *args: Any) -> Any:
        method = getattr(self.engine, name)
        call = getattr(method, "remote", None)  # a Ray actor handle, or an engine object
        if call is not None:
            import ray

            return ray.get(call(*args))
        return method(*args)

    def pause_generation(self) -> int:
        """A weight sync is coming (partial rollouts): with `rollout.pause_mode` abort, abort the requests in
        flight and return once the engine has answered them; with retract / in_place, pause them inside the
        engine servers (SGLang's /pause_generation). No request starts until `resume_generation`. Returns how
        many requests the pause touched."""
        mode = self.config.rollout.pause_mode
        if mode != "abort":  # the engines keep the requests: here only no new one starts
            with self._cv:
                self._paused = True
            return int(self._engine_call("pause_generation", mode) or 0)
        with self._cv:
            self._paused = True
            rids = sorted(self._in_flight)
            self._sync_aborted.update(rids)
        for rid in rids:
            self._engine_call("abort", rid)
        with self._cv:
            while self._generating:
                self._cv.wait()
        return len(rids)

    def resume_generation(self, version: int) -> None:
        """The engine now serves `version`: continue the paused requests with it (in the engines, or here)."""
        if self.config.rollout.pause_mode != "abort":
            self._engine_call("continue_generation")
        with self._cv:
            self._version = max(self._version, int(version))
            self._paused = False
            self._cv.notify_all()

    def _off_policy_tokens(self, groups: list[list[Sample]], step: int, resumed: int) -> dict[str, float]:
        """After the method's finish: versions aligned to the final responses and `rollout.stale_tokens`
        applied (the staleness against the step that trains them is measured by the loop when it takes them)."""
        r = self.config.rollout
        mask = r.partial_rollouts and r.stale_token_policy == "mask"
        masked = spanning = 0
        for s in (s for g in groups for s in g):
            versions = list(s.token_versions or [])
            n = len(s.response_ids)
            if len(versions) != n:  # a method rewrote the response (DA-GRPO's spliced text): newest version
                versions = (versions + [max(versions, default=step)] * n)[:n]
            s.token_versions = versions
            spanning += len(set(versions)) > 1
            if mask and versions:
                newest = max(versions)
                for k, v in enumerate(versions):
                    if v < newest and s.loss_mask[k] > 0:
                        s.loss_mask[k] = 0.0
                        masked += 1
        out = {"rollout/partial_aborted": float(resumed), "rollout/samples_spanning_versions": float(spanning)}
        if r.partial_rollouts:
            out["rollout/stale_tokens_masked"] = float(masked)
        return out

    def _to_sample(self, req: GenerateRequest, res: GenerateResult, row: dict, step: int, prompt_index: int) -> Sample:
        text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        routed = None
        if req.return_routed_experts and res.finish_reason != "failed":
            if res.routed_experts is None:
                raise ValueError(f"request {req.rid!r} asked for routed experts (train.routing_replay) but the engine "
                                 "returned none (an SGLang server needs --enable-return-routed-experts)")
            routed = res.routed_experts  # [prompt + response - 1, moe_layers, top_k]
        return Sample(
            sample_id=req.rid,
            prompt_ids=list(req.input_ids),
            response_ids=list(res.output_ids),
            group_id=f"s{step}-p{prompt_index}",
            logprobs=list(res.logprobs) if res.logprobs is not None else None,
            routed_experts=routed,
            status=STATUS_BY_FINISH.get(res.finish_reason, SampleStatus.FAILED),
            label=row["label"],
            response_text=text,
            metadata={"row_id": row.get("row_id"), "question": row.get("prompt"), "level": row.get("level"), "finish_reason": res.finish_reason,
                      "cached_tokens": res.cached_tokens, "annotations": res.annotations,
                      "weight_version": res.weight_version, "served_by": res.served_by},
        )

    @property
    def train_kind(self) -> str:
        return self.method.train_kind

    def get_train_kind(self) -> str:  # the same, callable on a Ray actor handle
        return self.method.train_kind

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return self.method.update(stats, step)

    def loss_spec(self) -> LossSpec:
        """The policy loss of the rollout just made: asked right after `rollout`, before `update`, so it is
        the spec of the method state that scored the batch; it goes to the trainer with the batch."""
        return self.method.loss_spec()

    def evaluate_after_step(self, row: dict[str, Any], run_dir: str | Path) -> None:
        """The method's between-steps evaluation (DA-GRPO: after each phase), run here, where the method and
        its controllers' state live, with this manager's engine."""
        self.method.evaluate_after_step(row, self.engine, Path(run_dir))

    def release_method(self) -> Method:
        """Hand the method back when RL ends (with its final state, for the final evaluations); the manager
        keeps no reference, so the run still has one method object and this manager rolls out no more."""
        method, self.method = self.method, None
        if method is None:
            raise RuntimeError("the rollout manager's method was already handed back")
        return method

    def state_dict(self) -> dict[str, Any]:
        phases = {k: v.state_dict() for k, v in self.phase_sources.items()} | self._pending_phase_states
        return {"data": self.data.state_dict(), "method": self.method.state_dict(), "phases": phases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.load_state_dict(state["data"])
        self.method.load_state_dict(state["method"])
        self.phase_sources.clear()
        self._pending_phase_states = dict(state.get("phases") or {})


class RemoteRolloutManager:
    """Synchronous driver-side handle of a RolloutManager Ray actor (the same methods as the object). The
    method lives in the actor: everything the driver asks of it during RL goes through here."""

    def __init__(self, handle: Any):
        import ray

        self._ray = ray
        self.handle = handle
        self.train_kind = ray.get(handle.get_train_kind.remote())

    def rollout(self, step: int, weight_version: Optional[int] = None) -> tuple[list[list[Sample]], dict[str, float]]:
        if weight_version is None:
            return self._ray.get(self.handle.rollout.remote(step))
        return self._ray.get(self.handle.rollout.remote(step, weight_version))

    def pause_generation(self) -> int:
        return self._ray.get(self.handle.pause_generation.remote())

    def resume_generation(self, version: int) -> None:
        self._ray.get(self.handle.resume_generation.remote(version))

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return self._ray.get(self.handle.update.remote(stats, step))

    def loss_spec(self) -> LossSpec:
        return self._ray.get(self.handle.loss_spec.remote())

    def evaluate_after_step(self, row: dict[str, Any], run_dir: str | Path) -> None:
        self._ray.get(self.handle.evaluate_after_step.remote(row, str(run_dir)))

    def release_method(self) -> Method:
        return self._ray.get(self.handle.release_method.remote())

    def state_dict(self) -> dict[str, Any]:
        return self._ray.get(self.handle.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ray.get(self.handle.load_state_dict.remote(state))
