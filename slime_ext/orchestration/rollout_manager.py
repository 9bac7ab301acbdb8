"""The rollout manager: prompts -> method plan -> engine requests -> samples -> method finish.

Runs as a Ray actor in the training loop (`RemoteRolloutManager` is the driver's synchronous handle;
`rollout.manager=driver` keeps it in the driver process) or as a plain object in tests. It owns the data source,
the tokenizer, the method (its controllers) and talks to the engine through the engine interface,
so the same code drives the embedded engine and SGLang servers.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Optional

from slime_ext.config.schema import Config
from slime_ext.data import Sample, SampleStatus
from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.engine.failures import StaleRollout
from slime_ext.methods.base import Method
from slime_ext.orchestration.local_endpoints import build_run_method
from slime_ext.orchestration.data_source import DataSource
from slime_ext.tasks.dataset import LoadReport
from slime_ext.tasks.lengths import LengthLimits, PromptTooLong, drop_too_long
from slime_ext.tasks.templates import get_template

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
    def __init__(self, config: Config, train_rows: list[dict], tokenizer: Any, engine: Any,
                 method: Optional[Method] = None):
        self.config = config
        self.tokenizer = tokenizer
        self.engine = engine
        self.method = method or build_run_method(config, tokenizer)
        self.data = DataSource(train_rows[: config.rollout.prompt_pool], config.run.seed, config.data.shuffle)
        self.template = get_template(config.data.template)
        self.phase_sources: dict[str, DataSource] = {}  # continual methods: one data order per phase
        self._pending_phase_states: dict[str, Any] = {}

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
        call = getattr(self.engine.generate, "remote", None)
        if call is not None:  # a Ray actor handle
            import ray

            return ray.get(call(requests))
        return self.engine.generate(requests)

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

    def rollout(self, step: int) -> tuple[list[list[Sample]], dict[str, float]]:
        """One step's rollouts, scored and with advantages; plus metrics (including timings)."""
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
        results = self._generate(requests)
        check_weight_versions(requests, results, step)
        t1 = time.perf_counter()
        groups: list[list[Sample]] = [[] for _ in rows]
        for req, res, i in zip(requests, results, where):
            groups[i].append(self._to_sample(req, res, rows[i], step, i))
        metrics = self.method.finish(groups, step)
        t2 = time.perf_counter()
        generated = sum(len(r.output_ids) for r in results)
        metrics.update({"time/rollout": t1 - t0, "time/reward": t2 - t1, "rollout/generated_tokens": generated,
                        "perf/rollout_tokens_per_s": generated / max(t1 - t0, 1e-9),
                        "rollout/failed": sum(r.finish_reason == "failed" for r in results) / len(results),
                        "rollout/epoch": source.epoch})
        metrics.update(version_metrics(results))
        return groups, metrics

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

    def state_dict(self) -> dict[str, Any]:
        phases = {k: v.state_dict() for k, v in self.phase_sources.items()} | self._pending_phase_states
        return {"data": self.data.state_dict(), "method": self.method.state_dict(), "phases": phases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.load_state_dict(state["data"])
        self.method.load_state_dict(state["method"])
        self.phase_sources.clear()
        self._pending_phase_states = dict(state.get("phases") or {})


class RemoteRolloutManager:
    """Synchronous driver-side handle of a RolloutManager Ray actor (the same methods as the object)."""

    def __init__(self, handle: Any):
        import ray

        self._ray = ray
        self.handle = handle
        self.train_kind = ray.get(handle.get_train_kind.remote())

    def rollout(self, step: int) -> tuple[list[list[Sample]], dict[str, float]]:
        return self._ray.get(self.handle.rollout.remote(step))

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return self._ray.get(self.handle.update.remote(stats, step))

    def state_dict(self) -> dict[str, Any]:
        return self._ray.get(self.handle.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ray.get(self.handle.load_state_dict.remote(state))
