"""The rollout engine a run uses: the in-process embedded engine actor, or engine servers behind a pool.

`rollout.engine: embedded` (the laptop default): one Ray actor holding the embedded engine.
`rollout.engine: sglang`: `sglang.num_engines` engine servers, one Ray actor each (placed as the plan's
`sglang_engine` group says), each owning its server process (SGLang on CUDA machines, the project's
SGLang-protocol server elsewhere: `slime_ext.engine.engine_server`), driven through
`slime_ext.engine.server_pool.ServerEnginePool`, optionally behind sglang-router.
Both answer the same interface, plus `sync_weights(source, version)`: `source` (the train group) pushes
its buckets from the trainer ranks to a target the engine describes; the driver sends control messages only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from slime_ext.config.schema import Config
from slime_ext.engine.engine_server import engine_dtype
from slime_ext.engine.lora_sync import adapter_name, lora_server_args
from slime_ext.engine.ray_engine import EmbeddedEngineActor, RemoteEngine
from slime_ext.engine.weight_sync import EmbeddedTarget, merge_stats, sync_metrics
from slime_ext.methods import registry
from slime_ext.orchestration.placement import ActorGroup, ray_options

log = logging.getLogger(__name__)


class VersionedRemoteEngine(RemoteEngine):
    """The embedded engine actor with the pool's sync call (it reports no weight versions): the trainer
    ranks hand their checksummed buckets to the actor themselves (`slime_ext.engine.weight_sync`)."""

    def __init__(self, handle: Any, engine_dtype: str = "float32", delta: bool = False,
                 timeout_s: Optional[float] = None, lora_name: Optional[str] = None):
        super().__init__(handle, lora_name)
        self.engine_dtype, self.delta, self.timeout_s = engine_dtype, delta, timeout_s

    def attach_weight_source(self, source: Any) -> None:
        """Nothing to restart here: the actor has no restore path to feed."""

    def sync_weights(self, source: Any, version: int | str) -> dict[str, float]:
        target = EmbeddedTarget(self.handle, self.engine_dtype, self.delta, timeout_s=self.timeout_s)
        return sync_metrics(merge_stats(source.push_weights(target, str(version))))


class RunEngine:
    """A run's engine, started and not waited for: `engine` (what the rollout manager and the evaluations
    call) waits for it the first time, so the trainer's ranks can start beside it. `shutdown` ends what was
    started, ready or not."""

    def __init__(self, finish: Callable[[], Any], shutdown: Callable[[], None]):
        self._finish, self.shutdown = finish, shutdown
        self._engine: Any = None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = self._finish()
        return self._engine


def colocated_sleep(cfg: Config) -> bool:
    """Whether the engines sleep while the trainer trains (and the trainer while they generate): colocated
    engine servers with `cluster.colocate_sleep`, and no rollout running beside training (rollout.max_staleness >= 1)."""
    return (cfg.rollout.engine == "sglang" and cfg.cluster.colocate and cfg.cluster.colocate_sleep
            and not cfg.rollout.asynchronous)


def sampler_env(cfg: Config) -> dict[str, str]:
    """The run's method's sampler modules, declared to the engine processes (and the servers they start)."""
    from sglang_patches.request_sampler import SAMPLER_MODULES_ENV

    modules = registry.run_sampler_modules(cfg)
    return {SAMPLER_MODULES_ENV: ",".join(modules)} if modules else {}


def start_engine(cfg: Config, group: ActorGroup, model_dir: Path, partner_dir: Optional[Path], run_dir: Path,
                 tokenizer: Any) -> RunEngine:
    if cfg.rollout.engine == "sglang":
        return _start_servers(cfg, group, model_dir, partner_dir, run_dir, tokenizer)
    handle = ray.remote(EmbeddedEngineActor).options(
        **ray_options(group), max_concurrency=2,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(cfg.rollout.threads), "OMP_WAIT_POLICY": "PASSIVE",
                                  **sampler_env(cfg)}}
    ).remote(str(model_dir), cfg.rollout.threads, str(partner_dir) if partner_dir else None,
             engine_dtype(cfg.rollout.precision) or "float32", cfg.rollout.engine_kernel)
    from slime_ext.engine.sync_deadline import sync_deadline_s

    engine = VersionedRemoteEngine(handle, engine_dtype(cfg.rollout.precision) or "float32", cfg.sglang.weight_sync_delta,
                                   sync_deadline_s(cfg.sglang.weight_sync_timeout_s, model_dir), adapter_name(cfg))
    return RunEngine(lambda: engine, lambda: ray.kill(handle))  # the handle queues calls until the actor is up


def _experts_per_token(cfg: Config, model_dir: Path) -> int:
    """num_experts_per_tok of the served checkpoint (its config.json), else of the config's model section."""
    import json

    path = Path(model_dir) / "config.json"
    if path.is_file():
        value = json.loads(path.read_text()).get("num_experts_per_tok")
        if value:
            return int(value)
    return int(cfg.model.num_experts_per_tok)


def _start_servers(cfg: Config, group: ActorGroup, model_dir: Path, partner_dir: Optional[Path], run_dir: Path,
                   tokenizer: Any) -> RunEngine:
    from slime_ext.engine.engine_server import EngineServerActor
    from slime_ext.engine.server_pool import ServerEnginePool

    s = cfg.sglang
    log_dir = run_dir / "engine_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **sampler_env(cfg)}}
    actors = [ray.remote(EngineServerActor).options(**ray_options(group), runtime_env=env).remote(
        i, s, str(model_dir), threads=cfg.rollout.threads, partner_dir=str(partner_dir) if partner_dir else None,
        log_dir=str(log_dir), dtype=engine_dtype(cfg.rollout.precision), kernel=cfg.rollout.engine_kernel,
        memory_saver=colocated_sleep(cfg), lora_args=lora_server_args(cfg))
        for i in range(s.num_engines)]
    log.info("starting %d engine server(s); logs in %s", s.num_engines, log_dir)
    started = [a.start.remote() for a in actors]  # every server starts at once; `finish` waits for them
    pool: Optional[ServerEnginePool] = None

    def shutdown() -> None:
        if pool is not None:
            pool.shutdown()
        for a in actors:
            ray.kill(a)

    def finish() -> ServerEnginePool:
        nonlocal pool
        try:
            urls = ray.get(started)
            client_kwargs = {"eos_token_id": tokenizer.eos_token_id, "tokenizer_path": str(model_dir),
                             "vocab_size": len(tokenizer)}
            if cfg.train.routing_replay:  # R3: the client splits meta_info.routed_experts by experts per token
                client_kwargs["moe_top_k"] = _experts_per_token(cfg, model_dir)
            if partner_dir is not None:  # SGLang serves the pair as one model of width 2V; our server holds two
                sglang_hosts = ray.get(actors[0].host_kind.remote()) == "sglang"
                client_kwargs.update({"partner_vocab": len(tokenizer)} if sglang_hosts else {"native_partner": True})
            pool = ServerEnginePool(actors, urls, s, str(run_dir / "engine_weights"), client_kwargs=client_kwargs,
                                    engine_dtype=engine_dtype(cfg.rollout.precision) or "float32",
                                    base_dir=str(model_dir), rank_engines=cfg.cluster.colocate,
                                    lora_name=adapter_name(cfg))
            if s.router and s.num_engines > 1:
                pool.start_router(log_path=str(log_dir / "router.log"))
            return pool
        except BaseException:
            shutdown()
            raise

    return RunEngine(finish, shutdown)


def start_scoring_servers(cfg: Config, group: ActorGroup, servers: Any, run_dir: Path) -> RunEngine:
    """The method's scoring servers (`Method.scoring_servers`: a teacher), started and not waited for; `engine` is
    their `ScoringPool`. Each serves `servers.checkpoint` with its own TP size and static memory share, never
    sleeps and never receives weights."""
    from slime_ext.engine.engine_server import EngineServerActor
    from slime_ext.engine.scoring_pool import ScoringPool

    s = cfg.sglang.model_copy(update={"tp_size": servers.tp_size, "num_engines": servers.num_engines,
                                      "mem_fraction_static": servers.mem_fraction_static,
                                      # ports of their own: the rollout engines take base_port + 0 .. n - 1
                                      "base_port": cfg.sglang.base_port + cfg.sglang.num_engines
                                      if cfg.sglang.base_port else cfg.sglang.base_port})
    log_dir = run_dir / "scoring_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}}
    actors = [ray.remote(EngineServerActor).options(**ray_options(group), runtime_env=env).remote(
        i, s, servers.checkpoint, threads=cfg.rollout.threads, log_dir=str(log_dir),
        dtype=engine_dtype(cfg.rollout.precision), kernel=cfg.rollout.engine_kernel)
        for i in range(servers.num_engines)]
    log.info("starting %d scoring server(s) for %s (%s); logs in %s", servers.num_engines, servers.key,
             servers.checkpoint, log_dir)
    started = [a.start.remote() for a in actors]

    def shutdown() -> None:
        for a in actors:
            ray.kill(a)

    def finish() -> ScoringPool:
        try:
            return ScoringPool(ray.get(started), timeout_s=cfg.sglang.request_timeout_s)
        except BaseException:
            shutdown()
            raise

    return RunEngine(finish, shutdown)


__all__ = ["adapter_name", "start_engine", "start_scoring_servers", "RunEngine", "VersionedRemoteEngine"]
