"""Several engine servers as one rollout engine: dispatch, weight sync, versions, restarts.

`ServerEnginePool` has the embedded engine's interface (`generate`, `abort`, `flush_cache`,
`sync_weights`, `metrics`) and talks to the servers only through `SGLangEngineClient`. It is built in the
driver (which owns the servers' Ray actors and the router process) and pickled to the rollout manager;
each process makes its own HTTP clients.

Dispatch. With `sglang.router: true` every request goes through sglang-router (`--policy manual
--assignment-mode min_load`) carrying the prompt's group as `X-SMG-Routing-Key`: a new group goes to the
least-loaded worker and the rest of the group follows it (one prefix cache). Without the router the pool
does the same itself: the requests of one prompt (identical input ids) form a group, and each group goes
to the engine with the fewest requests outstanding.

Faults. A request that still fails after the client's retries comes back "failed". The pool then checks
each engine's process: a dead (or unanswering) server is restarted by its actor on the same port with the
newest weights and version (at most `sglang.max_restarts` times per engine), and the failed requests are
sent again unchanged (same rid, seed and samplers, so the same tokens). When an engine's restarts are
used up, `EngineUnavailable` stops the run (the loop keeps the checkpoint and prints the resume command).
Each restart and the requests re-sent after it are also kept for `take_restart_report()`: the pool lives
in the rollout manager (a Ray actor whose log the driver does not show), so the manager hands the report
to the driver with the step's metrics (`engine/restarts`, `engine/resent_requests`, `engine_events.jsonl`).

Versions. Every sync sets the engines' weight version to the step's; every result carries the version
that produced it (`GenerateResult.weight_version`), and `versions()` reads what each engine serves.
"""

from __future__ import annotations

import contextlib
import json
import re
import logging
import shutil
import sys
import threading
import time
import uuid
from collections import OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch

from slime_ext.data.generation import GenerateRequest, GenerateResult, check_unique_rids
from slime_ext.engine.failures import EngineUnavailable, WeightSyncError
from slime_ext.engine.ray_engine import name_adapter
from slime_ext.engine.sglang_client import SGLangEngineClient
from slime_ext.engine.engine_server import INITIAL_VERSION
from slime_ext.engine.weight_sync import (LocalWeightSource, ServerTarget, merge_stats, on_all_engines, sync_metrics,
                                          write_index)

log = logging.getLogger(__name__)
LATEST = "latest.json"
KEEP_SNAPSHOTS = 2


STICKY_KEYS = 1 << 16  # affinity keys whose engine the pool remembers (least recently used forgotten first)


def group_key(request: GenerateRequest) -> str:
    """Requests with the same input ids share a prefix cache entry: one key per prompt group. A request with an
    affinity key (a multi-turn episode's turns, slime_ext/envs) is keyed by it instead."""
    if request.affinity is not None:
        return "a:" + request.affinity
    return format(hash(tuple(request.input_ids)) & 0xFFFF_FFFF_FFFF, "x")


def _get(handle: Any, method: str, *args: Any) -> Any:
    """Call a method of an engine actor: a Ray handle, or a plain object in tests."""
    fn = getattr(handle, method)
    remote = getattr(fn, "remote", None)
    if remote is None:
        return fn(*args)
    import ray

    return ray.get(remote(*args))


class ServerEnginePool:
    def __init__(self, actors: Sequence[Any], urls: Sequence[str], cfg_sglang: Any, weights_dir: str, *,
                 client_kwargs: Optional[dict[str, Any]] = None, router_url: Optional[str] = None,
                 engine_dtype: str = "float32", base_dir: Optional[str] = None, rank_engines: bool = False,
                 lora_name: Optional[str] = None):
        self.actors = list(actors)
        self.lora_name = lora_name  # the adapter every request names (train.lora.sync: adapter)
        self.urls = list(urls)
        if cfg_sglang.weight_sync == "auto":  # a section built outside a run's config (tools, tests): resolved
            cfg_sglang = cfg_sglang.model_copy(update={"weight_sync": cfg_sglang.auto_weight_sync(colocate=True)})
        self.cfg = cfg_sglang
        self.weights_dir = Path(weights_dir)
        self.client_kwargs = dict(client_kwargs or {})
        self.router_url = router_url
        self.engine_dtype = engine_dtype
        self.base_dir = Path(base_dir) if base_dir else None  # config.json for disk versions
        from slime_ext.engine.sync_deadline import sync_deadline_s

        # one sync (the ranks' pushes) and each control call in it must finish within this (weight_sync_timeout_s)
        self.sync_timeout_s = sync_deadline_s(cfg_sglang.weight_sync_timeout_s, self.base_dir)
        self._standin: Optional[bool] = None  # every engine the project's server (see _same_layout)
        # colocated engines: each trainer rank sends to the engine rank on its own device (ServerTarget.rank_engines)
        self.rank_engines = bool(rank_engines)
        self.weight_source: Any = None
        self.generation = "0"
        self.syncs = 0
        self._init_local()

    # -- per-process state (not pickled) -------------------------------------------------------------
    def _client(self, url: str, **extra: Any) -> SGLangEngineClient:
        kwargs = {"batching": self.cfg.generate_batching, **self.client_kwargs, **extra}
        return SGLangEngineClient(url, timeout_s=self.cfg.request_timeout_s, max_retries=2, backoff_s=0.2, **kwargs)

    def _init_local(self) -> None:
        self.clients = [self._client(u) for u in self.urls]
        # the sync's control calls: bounded by the sync's deadline, never retried (collective with the ranks)
        self.control_clients = [SGLangEngineClient(u, timeout_s=self.sync_timeout_s, max_retries=0, **self.client_kwargs)
                                for u in self.urls]
        # sglang-router reads single-request bodies only (a batch is a 422): one request per call through it
        self.router = self._client(self.router_url, routing_key=group_key, batching="request") \
            if self.router_url else None
        self._lock = threading.Lock()
        self._outstanding = [0] * len(self.urls)
        self._owner: dict[str, int] = {}
        self._sticky: OrderedDict[str, int] = OrderedDict()  # affinity group key -> the engine that served it
        self._restarts_seen = [0] * len(self.urls)
        self.served = defaultdict(int)  # engine index -> requests answered (tests, metrics)
        self.restarts = 0
        self._restart_events: list[dict[str, Any]] = []  # since the last take_restart_report()
        self._resent = 0

    def __getstate__(self) -> dict[str, Any]:
        keep = ("actors", "urls", "cfg", "weights_dir", "client_kwargs", "router_url", "engine_dtype", "base_dir",
                "weight_source", "generation", "syncs", "sync_timeout_s", "_standin", "rank_engines", "lora_name")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    # -- generation ----------------------------------------------------------------------------------
    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        check_unique_rids(requests)
        requests = name_adapter(requests, self.lora_name)
        if self.router is not None:
            results = self.router.generate(requests)
        else:
            results = self._dispatch(requests)
        return self._recover(requests, results)

    def _assign(self, requests: Sequence[GenerateRequest]) -> list[int]:
        """Engine index of each request: whole prompt groups to the least-outstanding engine; a group with an
        affinity key to the engine that served that key before."""
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(group_key(r), []).append(i)
        engine_of = [0] * len(requests)
        with self._lock:
            load = list(self._outstanding)
            for key, members in groups.items():
                e = self._sticky.get(key)
                if e is None:
                    e = min(range(len(load)), key=lambda k: (load[k], k))
                if requests[members[0]].affinity is not None:
                    self._sticky[key] = e
                    self._sticky.move_to_end(key)
                    while len(self._sticky) > STICKY_KEYS:
                        self._sticky.popitem(last=False)
                load[e] += len(members)
                for i in members:
                    engine_of[i] = e
        return engine_of

    def _dispatch(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        engine_of = self._assign(requests)
        by_engine: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(engine_of):
            by_engine[e].append(i)
        out: list[Optional[GenerateResult]] = [None] * len(requests)

        def run(e: int, idx: list[int]) -> None:
            with self._lock:
                self._outstanding[e] += len(idx)
                for i in idx:
                    self._owner[requests[i].rid] = e
            try:
                results = self.clients[e].generate([requests[i] for i in idx])
            finally:
                with self._lock:
                    self._outstanding[e] -= len(idx)
                    for i in idx:
                        self._owner.pop(requests[i].rid, None)
            for i, res in zip(idx, results):
                res.served_by = self.urls[e]
                out[i] = res
                if res.finish_reason != "failed":
                    self.served[e] += 1

        with ThreadPoolExecutor(max_workers=max(1, len(by_engine)), thread_name_prefix="engine-dispatch") as pool:
            for f in [pool.submit(run, e, idx) for e, idx in by_engine.items()]:
                f.result()
        return [r for r in out if r is not None]

    def _recover(self, requests: list[GenerateRequest], results: list[GenerateResult]) -> list[GenerateResult]:
        """Restart dead engines and send the failed requests again until none fails or restarts run out."""
        results = list(results)
        while True:
            failed = [i for i, r in enumerate(results) if r.finish_reason == "failed"]
            if not failed:
                return results
            restarted = self.restart_unhealthy()
            if not restarted:
                errors = sorted({results[i].error or "?" for i in failed})
                log.warning("%d request(s) failed with every engine healthy: %s", len(failed), errors[:3])
                return results  # request-level failures (bad request): the method sees them as failed
            log.warning("re-sending %d request(s) after restarting engine(s) %s", len(failed), restarted)
            self._note_resent(len(failed), restarted)
            again = self._dispatch([requests[i] for i in failed])
            for i, res in zip(failed, again):
                results[i] = res

    def restart_unhealthy(self) -> list[int]:
        """Restart every engine whose process died or whose /health does not answer. Raises
        EngineUnavailable when an engine has used up `sglang.max_restarts`."""
        restarted = []
        for e, (actor, client) in enumerate(zip(self.actors, self.clients)):
            reason = self._down_reason(actor, client)
            if reason is None:
                continue
            used = _get(actor, "restart_count")
            if used >= self.cfg.max_restarts:
                raise EngineUnavailable(
                    f"engine {e} ({self.urls[e]}) died or stopped answering and its {self.cfg.max_restarts} "
                    f"restart(s) (sglang.max_restarts) are used up")
            snapshot, snapshot_version, version = self.restore_point()
            log.warning("engine %d (%s) is down: restart %d/%d from %s (version %s), then to version %s", e,
                        self.urls[e], used + 1, self.cfg.max_restarts, snapshot or "the base checkpoint",
                        snapshot_version, version)
            try:
                _get(actor, "restart", snapshot, snapshot_version)
            except Exception as exc:  # noqa: BLE001 - a restart that fails is a lost engine
                raise EngineUnavailable(f"engine {e} ({self.urls[e]}) could not be restarted: {exc}") from exc
            self.new_generation()
            # an engine that serves an adapter (train.lora.sync: adapter) comes back with the base alone
            if snapshot_version != version or self.lora_name is not None:
                self.bring_current(e, version)
            self.restarts += 1
            self._note_restart(e, used + 1, reason)
            restarted.append(e)
        return restarted

    def _down_reason(self, actor: Any, client: SGLangEngineClient) -> Optional[str]:
        """Why engine `actor` needs a restart (None: it is fine). Said in the restart events, since a dead
        process (killed, crashed) and a hung one (no /health answer) call for different investigations."""
        if not _get(actor, "alive"):
            return "its server process died"
        if not client.health(timeout_s=min(10.0, self.cfg.request_timeout_s)):
            return "it did not answer /health"
        return None

    # -- restart report (for the driver: this copy of the pool may live in a Ray actor) ------------------
    def _note_restart(self, e: int, restart: int, reason: str) -> None:
        event = {"time": time.time(), "engine": e, "url": self.urls[e], "restart": restart,
                 "max_restarts": int(self.cfg.max_restarts), "reason": reason}
        with self._lock:
            self._restart_events.append(event)

    def _note_resent(self, n: int, engines: list[int]) -> None:
        """`n` requests went out again after restarting `engines`: counted, and noted on those restarts."""
        with self._lock:
            self._resent += n
            for event in self._restart_events:
                if event["engine"] in engines and "resent_requests" not in event:
                    event["resent_requests"] = n

    def take_restart_report(self) -> dict[str, Any]:
        """Restarts and re-sent requests since the last call, and forget them: {"restarts": n,
        "resent_requests": m, "events": [{time, engine, url, restart, max_restarts, reason,
        resent_requests}]}. `resent_requests` of an event counts the requests re-sent after its round of
        restarts (shared by the engines restarted in that round)."""
        with self._lock:
            events, resent = self._restart_events, self._resent
            self._restart_events, self._resent = [], 0
        return {"restarts": len(events), "resent_requests": resent, "events": events}

    def abort(self, rid: str) -> None:
        with self._lock:
            e = self._owner.get(rid)
        if self.router is not None:
            self.router.abort(rid)
        elif e is not None:
            self.clients[e].abort(rid)

    def flush_cache(self) -> None:
        for c in self.clients:
            c.flush_cache()

    # -- weights -------------------------------------------------------------------------------------
    def attach_weight_source(self, source: Any) -> None:
        """What brings a restarted engine to the current version (the train group: its ranks push). Attach
        it before the pool is handed to the rollout manager, whose copy restarts engines mid-rollout."""
        self.weight_source = source

    @contextlib.contextmanager
    def _weight_session(self, kind: str, engines: Optional[Sequence[int]] = None) -> Iterator[bool]:
        """SGLang's weight-update session on the engines around a whole push (tensor and distributed updates
        need one; a server allows one at a time, so every sender's calls share the driver's). Yields whether
        one is open (disk loads need none)."""
        if kind not in ("tensor", "distributed"):
            yield False
            return
        clients = [self.control_clients[e] for e in (range(len(self.urls)) if engines is None else engines)]
        on_all_engines(clients, "begin_weight_update", lambda i, c: c.begin_weight_update())
        try:
            yield True
        finally:
            on_all_engines(clients, "end_weight_update", lambda i, c: c.end_weight_update())

    def weight_target(self, urls: Optional[Sequence[str]] = None, directory: Optional[Path] = None,
                      kind: Optional[str] = None, delta: Optional[bool] = None) -> ServerTarget:
        """The description the trainer ranks push to (no tensors: picklable and small)."""
        return ServerTarget(kind or self.cfg.weight_sync, list(urls or self.urls), engine_dtype=self.engine_dtype,
                            delta=self.cfg.weight_sync_delta if delta is None else delta, tp_size=self.cfg.tp_size,
                            directory=str(directory) if directory else None, generation=self.generation,
                            timeout_s=self.sync_timeout_s, sender_checksums=self._same_layout(),
                            expert_senders=self.cfg.expert_senders, rank_engines=self.rank_engines)

    def _same_layout(self) -> bool:
        """True when every engine is the project's server (HF-named, unsharded weights): its checksums can be
        held to the senders'. SGLang's own engines fuse and shard, and hash on the GPU: engines only."""
        if self._standin is None:
            self._standin = all(_get(a, "host_kind") == "standin" if hasattr(a, "host_kind") else False
                                for a in self.actors)
        return bool(self._standin)

    def restore_point(self) -> tuple[Optional[str], str, str]:
        """(snapshot dir or None for the base checkpoint, that snapshot's version, the current version)."""
        path = self.weights_dir / LATEST
        if not path.exists():
            return None, INITIAL_VERSION, INITIAL_VERSION
        info = json.loads(path.read_text())
        return info.get("snapshot"), str(info.get("snapshot_version", INITIAL_VERSION)), str(info["version"])

    def sync_weights(self, source: Any, version: int | str) -> dict[str, float]:
        """The trainer ranks push their buckets to every engine under `version`; this process sends the
        control messages only (the disk index, the version, the checks). Returns timings and counts."""
        version = str(version)
        counts = [_get(a, "restart_count") for a in self.actors]
        if counts != self._restarts_seen:
            self.new_generation()  # a restarted engine is in no old weight-update group
        self._restarts_seen = counts
        self.syncs += 1
        t0 = time.perf_counter()
        disk = self.cfg.weight_sync == "disk"
        directory = self.weights_dir / f"v{version}" if disk else None
        target = self.weight_target(directory=directory)
        with self._weight_session(target.kind) as held:
            target.session_open = held
            stats = merge_stats(source.push_weights(target, version))
        t1 = time.perf_counter()
        snapshot: Optional[Path] = None
        if disk:
            snapshot = write_index(directory, stats["weight_map"], int(stats.get("bytes_sent", 0)), self.base_dir)
            on_all_engines(self.control_clients, f"update_weights_from_disk (version {version})",
                           lambda i, c: c.update_weights_from_disk(str(snapshot), weight_version=version))
        else:
            on_all_engines(self.control_clients, f"update_weight_version ({version})",
                           lambda i, c: c.update_weight_version(version))
        t2 = time.perf_counter()
        if snapshot is None and self.cfg.snapshot_every and self.syncs % self.cfg.snapshot_every == 0:
            snapshot = self.write_snapshot(source, version)
        self._record(version, snapshot)
        at_version = self.check_versions(version)
        t3 = time.perf_counter()
        verified = self.verify_checksums(version, stats.get("checksums"))
        return {**sync_metrics(stats), "time/sync_push": t1 - t0, "time/sync_commit": t2 - t1,
                "time/sync_snapshot": t3 - t2, "time/sync_verify": time.perf_counter() - t3,
                "sync/engines_at_version": at_version, **verified}

    def _on_engines(self, what: str, call: Any) -> list[Any]:
        answers: list[Any] = [None] * len(self.control_clients)

        def one(i: int, client: SGLangEngineClient) -> None:
            answers[i] = call(client)

        on_all_engines(self.control_clients, what, one)
        return answers

    def verify_checksums(self, version: str, sent: Optional[dict[str, str]]) -> dict[str, float]:
        """Every engine's `/weights_checker` checksum after a sync: engines holding the same shards must agree,
        and where the layouts match (`sent`: what the senders hashed) each tensor must equal what was sent.
        Raises WeightSyncError naming the engines or tensors (the run stops with the resume command)."""
        answers = self._on_engines(f"weights_checker checksum (version {version})",
                                   lambda c: c.check_weights("checksum"))
        per_engine = [a.get("per_engine_checksum") for a in answers]
        if len(set(per_engine)) > 1:  # every engine has the same TP layout and the same weights
            held = {self.urls[i]: (v or "?")[:16] for i, v in enumerate(per_engine)}
            raise WeightSyncError(f"after the sync of version {version} the engines hold different weights "
                                  f"(per-engine checksums {held}): a bucket was lost or corrupted on its way to "
                                  f"some engines")
        compared = 0
        if sent:
            for i, answer in enumerate(answers):
                held = (answer.get("ranks") or [{}])[0].get("checksums", {})
                wrong = sorted(n for n, h in sent.items() if n in held and held[n] != h)
                compared = sum(1 for n in sent if n in held)
                if wrong:
                    raise WeightSyncError(f"after the sync of version {version} engine {i} ({self.urls[i]}) holds "
                                          f"{len(wrong)} tensor(s) other than the trainer sent: {wrong[:5]}")
        return {"sync/checksum_engines": float(len(answers)), "sync/checksum_tensors_vs_senders": float(compared)}

    def verify_refit(self, source: Any, version: int | str) -> dict[str, float]:
        """The first sync of a run, checked bit for bit as SGLang's weight checker allows: the engines snapshot
        the weights they loaded (the base checkpoint, which the trainer also starts from), reset every tensor
        to random values, receive the sync from the ranks and compare with the snapshot: a tensor the sync
        missed, or delivered wrong, differs. Raises WeightSyncError naming the engine and the tensors."""
        self._on_engines("weights_checker snapshot", lambda c: c.check_weights("snapshot"))
        self._on_engines("weights_checker reset_tensors", lambda c: c.check_weights("reset_tensors"))
        metrics = self.sync_weights(source, version)
        try:
            self._on_engines("weights_checker compare", lambda c: c.check_weights("compare"))
        except WeightSyncError as exc:  # the tensors first: the stop message keeps one line of it
            names = sorted(set(re.findall(r"name=([\w.]+)", str(exc))))
            raise WeightSyncError(f"the first sync (version {version}) did not reproduce the base checkpoint's "
                                  f"weights: {len(names)} tensor(s) differ ({', '.join(names[:4])}"
                                  f"{', ...' if len(names) > 4 else ''}); {exc}") from None
        return {**metrics, "sync/refit_verified": 1.0}

    def write_snapshot(self, source: Any, version: str) -> Path:
        """A restore point written shard by shard by the ranks (`sglang.snapshot_every`)."""
        directory = self.weights_dir / f"v{version}"
        target = self.weight_target(kind="disk", directory=directory, delta=False)
        stats = merge_stats(source.push_weights(target, version))
        return write_index(directory, stats["weight_map"], int(stats.get("bytes_sent", 0)), self.base_dir)

    def _record(self, version: str, snapshot: Optional[Path]) -> None:
        """latest.json: the current version and the newest complete snapshot (metadata only)."""
        old_snapshot, old_version, _ = self.restore_point()
        info = {"version": version, "snapshot": str(snapshot) if snapshot else old_snapshot,
                "snapshot_version": version if snapshot else old_version}
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        (self.weights_dir / f"{LATEST}.tmp").write_text(json.dumps(info))
        (self.weights_dir / f"{LATEST}.tmp").replace(self.weights_dir / LATEST)
        if snapshot is not None:
            self._prune_snapshots(keep=str(snapshot))

    def new_generation(self) -> None:
        """A fresh token for the weight-update groups: the senders build new ones (each copy of the pool, in
        the driver and in the rollout manager, draws its own, so the two never name the same group)."""
        self.generation = uuid.uuid4().hex[:8]

    def bring_current(self, e: int, version: str) -> None:
        """A restarted engine that came back at an older version gets the current weights from the ranks."""
        source = getattr(self, "weight_source", None)
        if source is None:
            raise EngineUnavailable(f"engine {e} ({self.urls[e]}) restarted at an older version than {version} and "
                                    f"no weight source is attached to bring it current")
        try:
            target = self.weight_target([self.urls[e]], delta=False)
            with self._weight_session(target.kind, [e]) as held:
                target.session_open = held
                source.push_weights(target, version, expect_version=version)
            self.clients[e].update_weight_version(version)
        except Exception as exc:  # noqa: BLE001 - the trainer moved on, or the engine died again
            cause = getattr(exc, "cause", None) or exc  # a rank's error arrives wrapped by Ray
            raise EngineUnavailable(
                f"engine {e} ({self.urls[e]}) restarted and could not be brought to version {version}: "
                f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}. With "
                f"rollouts beside training (rollout.max_staleness >= 1) set sglang.snapshot_every=1 so a restart "
                f"restores the current version from a snapshot") from exc

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The engine interface's update from tensors in this process (tools, tests): versioned "unversioned"."""
        self.sync_weights(LocalWeightSource(list(named_tensors)), "unversioned")

    def check_versions(self, version: str) -> int:
        """Every engine must now serve `version` (asked over /model_info); returns how many do."""
        served = self.versions()
        wrong = {self.urls[i]: v for i, v in enumerate(served) if v != version}
        if wrong:
            raise WeightSyncError(f"after the sync of version {version} the engines serve {wrong}")
        return len(served)

    def versions(self) -> list[Optional[str]]:
        return [c.weight_version() for c in self.clients]

    def _prune_snapshots(self, keep: str) -> None:
        snaps = sorted((p for p in self.weights_dir.glob("v*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in snaps[:-KEEP_SNAPSHOTS]:
            if str(old) != keep:
                shutil.rmtree(old, ignore_errors=True)

    # -- the rest of the engine interface ------------------------------------------------------------
    def release_memory_occupation(self) -> None:
        for c in self.clients:
            c.release_memory_occupation()

    def resume_memory_occupation(self) -> None:
        for c in self.clients:
            c.resume_memory_occupation()

    # -- colocated sleep (the loop: sleep before training; wake weights, sync, wake the KV cache) --------
    def sleep(self) -> dict[str, float]:
        """Every engine releases its weights and KV cache (SGLang's tags: all); returns the bytes the engines'
        processes gave back (`engine/released_bytes`, measured by their actors) and the time it took."""
        t0 = time.perf_counter()
        before = [_get(a, "memory_in_use") for a in self.actors]
        self._on_engines("release_memory_occupation", lambda c: c.release_memory_occupation(None))
        after = [_get(a, "memory_in_use") for a in self.actors]
        return {"engine/released_bytes": float(sum(max(0, b - a) for b, a in zip(before, after))),
                "time/engine_sleep": time.perf_counter() - t0}

    def pause_generation(self, mode: str) -> int:
        """Every engine pauses its requests (SGLang's /pause_generation, `rollout.pause_mode`) before a weight sync."""
        return sum(self._on_engines(f"pause_generation ({mode})", lambda c: c.pause_generation(mode)))

    def continue_generation(self) -> None:
        self._on_engines("continue_generation", lambda c: c.continue_generation())

    def wake_weights(self) -> None:
        """Weights first, so the sync has somewhere to go; the KV cache after it (`wake_kv_cache`)."""
        self._on_engines("resume_memory_occupation (weights)", lambda c: c.resume_memory_occupation(["weights"]))

    def wake_kv_cache(self) -> None:
        self._on_engines("resume_memory_occupation (kv_cache)",
                         lambda c: c.resume_memory_occupation(["kv_cache", "cuda_graph"]))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for c in self.clients + ([self.router] if self.router else []):
            for k, v in c.metrics().items():
                out[k] += v
        out["engines"] = len(self.clients)
        out["engine_restarts"] = sum(_get(a, "restart_count") for a in self.actors)
        return dict(out)

    # -- lifetime ------------------------------------------------------------------------------------
    def start_router(self, log_path: Optional[str] = None, timeout_s: float = 120.0) -> str:
        """sglang-router in front of the engines (manual policy, min-load assignment of new groups)."""
        from slime_ext.engine.engine_server import free_port, listen_host
        from slime_ext.engine.sglang_launcher import SGLangServer

        host = listen_host(self.cfg.host)
        port = free_port(host)
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
                "--worker-urls", *self.urls, "--policy", "manual", "--assignment-mode", "min_load",
                "--log-level", "warn", "--request-timeout-secs", str(int(self.cfg.request_timeout_s))]
        server = SGLangServer(argv, host, port, startup_timeout_s=timeout_s, poll_interval_s=0.2,
                              log_path=log_path)
        server.start()
        server.wait_healthy()
        self._router_server = server
        self.router_url = server.base_url
        self.router = self._client(self.router_url, routing_key=group_key)
        log.info("sglang-router at %s in front of %d engine(s)", self.router_url, len(self.urls))
        return self.router_url

    def shutdown(self) -> None:
        server = getattr(self, "_router_server", None)
        if server is not None:
            server.stop(grace_s=5.0)
            self._router_server = None
        for a in self.actors:
            try:
                _get(a, "stop")
            except Exception as exc:  # noqa: BLE001 - a dead actor has nothing left to stop
                log.debug("engine stop: %s", exc)


__all__ = ["ServerEnginePool", "group_key"]
