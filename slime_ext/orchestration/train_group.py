"""The train actor group: one Ray actor per megatron_glue rank, driven in lockstep from the driver.

Placement follows the cluster config: on a CPU machine all ranks share one node (gloo, no GPU
bundles); on a GPU cluster each rank gets a `{"GPU": 1}` bundle of one placement group (NCCL), packed
node by node, as slime places its train actors.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Optional

import ray
import torch

from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.model_provider import ParallelSizes
from slime_ext.algo import LossSpec
from slime_ext.orchestration.placement import ActorGroup, Placement, ray_options


def push_from_rank(trainer: MegatronTrainer, target: Any, bucket_bytes: int) -> Optional[dict]:
    """One rank's part of a weight push. Every rank walks its buckets (the TP / expert gathers are
    collective); the stage's sender rank hands each bucket to `target.open(...)` (an engine or a directory)
    as it comes, so no process holds more than its shard plus a bucket in flight. With delta sync every rank
    keeps what the engines hold of its own shard (`held_weights`) and gathers it beside its weights, so the
    sender compares bucket by bucket. Returns the sender's counts with its peak RSS growth and shard size
    (None on the other ranks)."""
    from megatron_glue.weight_export import (all_ranks_agree, is_bucket_sender, iter_hf_weight_bucket_pairs,
                                             iter_hf_weight_buckets, sender_key, sends_dense, sends_own_experts)
    from slime_ext.engine.held_weights import held_weights
    from slime_ext.engine.weight_sync import PeakRSS, return_freed_memory

    return_freed_memory()  # the start level counts live memory, not what earlier steps left in the heap
    local = trainer.local_state_dict()  # views of the parameters: valid across the push
    # senders per EP rank (each its own experts) where the transport takes several senders' parts of one sync
    experts = bool(getattr(target, "expert_senders", False)) and trainer.sizes.ep > 1
    held = held_weights(target, sender_key(experts))  # the same on every rank: one target, one config
    # the branch is collective: every rank must hold its copy (a first delta sync has none: dense)
    known = held is not None and all_ranks_agree(held.matches(local))
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    per_engine = hasattr(target, "per_engine_rank") and target.per_engine_rank(world, trainer.sizes.pp)
    with PeakRSS() as peak:
        if per_engine:  # colocated refit: every rank sends its own copy, read by the engine rank on its device
            sending = True
            sender = target.open_rank(torch.distributed.get_rank() if world > 1 else 0)
        else:
            sending = is_bucket_sender(experts)
            sender = target.open(sender_key(experts)) if sending else None
        # NCCL broadcasts and CUDA IPC handles read the buckets where the weights live; files and Ray objects
        # are written from the host
        to_host = target.kind in ("disk", "embedded")
        peak.phase = "gather"
        if known:
            pairs = iter_hf_weight_bucket_pairs(trainer, held.values, bucket_bytes, to_host=to_host,
                                                collect=sending)
        elif experts:
            pairs = ((bucket, None) for bucket in iter_hf_weight_buckets(
                trainer, bucket_bytes, to_host=to_host, collect=sends_dense(), own_experts=sends_own_experts()))
        else:
            pairs = ((bucket, None) for bucket in iter_hf_weight_buckets(trainer, bucket_bytes, to_host=to_host,
                                                                         collect=sending))
        for bucket, before in pairs:
            if sender is not None:
                peak.phase = "send"
                sender.send(bucket, before)
            del bucket, before
            return_freed_memory()
            peak.phase = "gather"
        peak.phase = "send"
        stats = sender.close() if sender is not None else None
    if held is not None:  # what the engines hold now (a failed push stops the run before this)
        held.record(local)
    if stats is not None:
        shard = sum(t.numel() * t.element_size() for t in local.values())
        stats.update(peak_rss_growth=peak.growth(), peak_rss_growth_gather=peak.growth("gather"),
                     peak_rss_growth_send=peak.growth("send"), shard_bytes=shard,
                     held_bytes=held.nbytes() if held is not None else 0)
    return stats


class TrainWorker:
    """One trainer rank (runs inside a Ray actor process)."""

    def __init__(self, rank: int, world: int, master_addr: Optional[str], threads: int):
        """Rank 0 hosts the rendezvous store at once, on `master_addr` (None: its node's address as Ray knows
        it, so ranks on other nodes reach it) and a port the OS assigns (`rendezvous`); every rank joins the
        group at that address and port in `join`, once all ranks exist. No rank waits for another to start,
        so their processes start (and import torch and Megatron) side by side."""
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        from megatron_glue.parallel import host_rendezvous
        from slime_ext.engine.weight_sync import node_address

        self.rank, self.world = rank, world
        self.master_addr = (master_addr or node_address()) if rank == 0 else master_addr
        self.store = host_rendezvous(self.master_addr, world) if rank == 0 else None
        self.trainer: Optional[MegatronTrainer] = None
        self.weights_version: Optional[str] = None

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's store: (address, port) for the other ranks to join."""
        assert self.store is not None, "only rank 0 hosts the rendezvous"
        return self.master_addr, self.store.port

    def join(self, master_addr: str, port: int) -> None:
        from megatron_glue.parallel import init_distributed

        self.master_addr = master_addr
        init_distributed(self.rank, self.world, master_addr, port, store=self.store)

    def setup(self, hf_config: Any, settings: TrainerSettings, sizes: dict, pad_id: int, hf_dir: Optional[str]) -> None:
        from megatron_glue.parallel import init_model_parallel

        parallel = ParallelSizes(**sizes)
        self.release_trainer()  # a rank set up again frees the last trainer before building this one
        init_model_parallel(parallel, seed=settings.seed)
        self.trainer = MegatronTrainer(hf_config, settings, parallel, pad_id=pad_id)
        if hf_dir is not None:
            self.load_hf(hf_dir)

    def release_trainer(self) -> None:
        """Drop the trainer (weights, gradients, optimizer state) and give its memory back, keeping the process
        and its process group: a job's RL stage sets a new trainer up here after its SFT stage, and the engines
        it starts in between may share the device."""
        import gc

        self.trainer, self.weights_version = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def load_hf(self, hf_dir: str) -> None:
        """Load this rank's shard of an HF checkpoint (reads only the tensors this rank holds)."""
        from megatron.core import parallel_state as mpu

        from megatron_glue.checkpoint_io import load_hf_checkpoint
        from megatron_glue.sharding import shard_megatron_state
        from megatron_glue.weight_names import hf_to_megatron

        self.weights_version = None
        hf_config, source = load_hf_checkpoint(hf_dir)
        sizes = self.trainer.sizes
        shard = shard_megatron_state(
            hf_to_megatron(source, self.trainer.hf_config), self.trainer.hf_config,
            tp_rank=mpu.get_tensor_model_parallel_rank(), tp_size=sizes.tp,
            ep_rank=mpu.get_expert_model_parallel_rank(), ep_size=sizes.ep,
            pp_rank=mpu.get_pipeline_model_parallel_rank(), pp_size=sizes.pp, etp_size=sizes.expert_tp,
        )
        self.trainer.load_local_state_dict(dict(shard))

    def set_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def train_step(self, samples: list, kind: str, ref_logprobs: Optional[dict] = None,
                   loss: Optional[LossSpec] = None) -> dict:
        """One batch; `loss` is the batch's own loss spec (RL: the method's, from the rollout manager with the
        rollout), None for the setup-time one (SFT)."""
        self.weights_version = None
        with self._awake():
            return self.trainer.train_step(samples, kind=kind, ref_logprobs=ref_logprobs, loss=loss)

    def compute_logprobs(self, samples: list, reference: bool = False) -> Optional[dict]:
        with self._awake():
            return self.trainer.compute_logprobs(samples, reference=reference)

    def snapshot_reference(self) -> None:
        self.trainer.snapshot_reference()

    def set_weights_version(self, version: Optional[str]) -> None:
        """The engine version these weights are (None: changed since the last push: trained or loaded)."""
        self.weights_version = version

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """The trainer's buffers present for the body: a call that reaches an offloaded rank (a restarted engine
        brought current mid-rollout, a save) brings them back for it and sends them away again after, instead of
        reading emptied storage."""
        sleep = getattr(self, "_sleep", None)
        asleep = sleep is not None and sleep.asleep
        if asleep:
            sleep.onload()
        try:
            yield
        finally:
            if asleep:
                sleep.offload()

    def offload(self) -> int:
        """Colocated sleep: this rank's weights, gradients and device optimizer state leave the GPU while the
        engines generate (megatron_glue.trainer_sleep); returns the bytes moved."""
        from megatron_glue.trainer_sleep import TrainerSleep

        if getattr(self, "_sleep", None) is None or self._sleep.trainer is not self.trainer:
            self._sleep = TrainerSleep(self.trainer)
        return self._sleep.offload()

    def onload(self) -> int:
        """Back before the train step (0 when nothing was offloaded)."""
        sleep = getattr(self, "_sleep", None)
        return sleep.onload() if sleep is not None else 0

    def push_weights(self, target: Any, bucket_bytes: int, version: Optional[str] = None,
                     expect_version: Optional[str] = None) -> Optional[dict]:
        """Every rank walks its buckets (the TP / expert gathers are collective); the stage's sender rank
        hands each bucket to `target` (an engine or a directory) as it comes, so no process holds more than
        its shard plus a bucket in flight. Returns the sender's counts and its peak RSS growth (None on the
        other ranks). `expect_version`: refuse unless these weights are still that version (a restarted
        engine brought current must not get weights trained since)."""
        if expect_version is not None and self.weights_version != expect_version:
            raise RuntimeError(f"the trainer's weights are no longer version {expect_version} "
                               f"(they are {self.weights_version or 'newer: trained since'})")
        with self._awake():
            # adapter sync goes to the engines (embedded actor, tensor servers); the HF export (disk) gets weights
            if self.trainer.adapters and self.trainer.settings.lora.sync == "adapter" and target.kind != "disk":
                from slime_ext.engine.lora_sync import push_lora_adapter

                stats = push_lora_adapter(self.trainer, target)  # the adapters alone (train.lora.sync: adapter)
            else:
                stats = push_from_rank(self.trainer, target, bucket_bytes)
        if version is not None:
            self.weights_version = version
        return stats

    def export_lora_adapter(self, directory: str, base_model: str) -> None:
        """The adapters in PEFT's layout (collective; global rank 0 writes)."""
        from megatron_glue.lora_export import write_peft_adapter

        with self._awake():
            write_peft_adapter(self.trainer, directory, base_model)

    def save(self, directory: str, extra: dict) -> str:
        from megatron_glue.trainer_checkpoint import save_checkpoint

        with self._awake():
            return str(save_checkpoint(self.trainer, directory, extra))

    def load(self, directory: str) -> dict:
        from megatron_glue.trainer_checkpoint import load_checkpoint

        self.weights_version = None
        return load_checkpoint(self.trainer, directory)

    def step_count(self) -> int:
        return self.trainer.step


def wait_for_ranks(futures: list[Any], timeout_s: Optional[float], what: str) -> list[Any]:
    """Every rank's result, in rank order, or WeightSyncError naming each rank still running after `timeout_s`
    (None: no deadline). A rank that failed raises its own error first, as `ray.get` does."""
    from slime_ext.engine.failures import WeightSyncError

    if timeout_s is None:
        return ray.get(futures)
    ready, pending = ray.wait(futures, num_returns=len(futures), timeout=timeout_s)
    if pending:
        ray.get(ready)  # a rank that failed: its own error, not a deadline
        late = sorted(futures.index(f) for f in pending)
        raise WeightSyncError(f"trainer rank(s) {late} of {len(futures)} did not finish {what} within {timeout_s:.0f} s "
                              f"(sglang.weight_sync_timeout_s): a rank hung in a gather or never sent")
    return ray.get(futures)


class TrainGroup:
    """Driver-side handle: creates the rank actors and calls them in lockstep."""

    def __init__(self, actors: ActorGroup, placement: Placement, threads: int, master_addr: Optional[str] = None,
                 bucket_mb: float = 512.0, wait: bool = True):
        """One rank actor per `actors.count`, each in its bundle of one placement group (`placement`);
        weights leave the ranks in buckets of `bucket_mb` (sglang.weight_bucket_mb); the ranks rendezvous at
        `master_addr`, by default rank 0's node address (never assumed to be 127.0.0.1). `wait=False` returns
        while the ranks' processes start (`wait_started` joins them), so other actors can start beside them."""
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.world = world = actors.count
        self.placement = ray.util.placement_group([dict(placement.bundle) for _ in range(placement.num_bundles)],
                                                  strategy=placement.strategy)
        ray.get(self.placement.ready())
        actor_cls = ray.remote(TrainWorker)
        env = {"env_vars": {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}}

        def start(rank: int) -> Any:
            return actor_cls.options(
                **ray_options(actors),
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    placement_group=self.placement, placement_group_bundle_index=actors.bundles[rank][0]),
                runtime_env=env,
            ).remote(rank, world, master_addr, threads)

        # every rank starts at once (a rank's process start is mostly imports: ~10 s each on a 2-core VM, which
        # ran one after the other when the others waited for rank 0's port); they join on the port rank 0 got
        self.workers = [start(rank) for rank in range(world)]
        self._joined = False
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait for the ranks' processes and join them into one process group (once)."""
        if not self._joined:
            self.call("join", *ray.get(self.workers[0].rendezvous.remote()))
            self._joined = True

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def first(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call every rank; return the first non-None result (the output rank's)."""
        return next((r for r in self.call(method, *args, **kwargs) if r is not None), None)

    def setup(self, hf_config: Any, settings: TrainerSettings, sizes: ParallelSizes, pad_id: int,
              hf_dir: Optional[str | Path]) -> None:
        self.call("setup", hf_config, settings, asdict(sizes), pad_id, str(hf_dir) if hf_dir else None)

    def push_weights(self, target: Any, version: Optional[str] = None, expect_version: Optional[str] = None) -> list[dict]:
        """The ranks push their buckets to `target` (never through this process); returns each sender's
        counts. After it the ranks' weights are `version` (see TrainWorker.push_weights for `expect_version`).
        Within the target's deadline (`timeout_s`: sglang.weight_sync_timeout_s), or WeightSyncError naming the
        ranks that did not finish."""
        futures = [w.push_weights.remote(target, self.bucket_bytes, version, expect_version) for w in self.workers]
        deadline = getattr(target, "timeout_s", None)
        stats = wait_for_ranks(futures, deadline, f"the push of weights {version or '(unversioned)'}")
        return [s for s in stats if s is not None]

    def set_weights_version(self, version: Optional[str]) -> None:
        self.call("set_weights_version", version)

    def export_hf_sharded(self, directory: str | Path, hf_config: Any) -> Path:
        """An HF checkpoint written shard by shard by the ranks that hold the weights (one safetensors file per
        bucket and sender), with the index and config.json written here: no gather into this process."""
        from slime_ext.engine.weight_sync import ServerTarget, merge_stats, write_index

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        for stale in list(root.glob("*.safetensors")) + [root / "model.safetensors.index.json"]:
            stale.unlink(missing_ok=True)
        stats = merge_stats(self.push_weights(ServerTarget("disk", [], engine_dtype=None, directory=str(root))))
        write_index(root, stats["weight_map"], int(stats.get("bytes_sent", 0)), None)
        cfg = copy.deepcopy(hf_config)
        if hasattr(cfg, "dtype"):  # as save_hf_checkpoint: the checkpoint's dtype is the embedding's
            from safetensors import safe_open

            with safe_open(str(root / stats["weight_map"]["model.embed_tokens.weight"]), framework="pt") as f:
                cfg.dtype = f.get_slice("model.embed_tokens.weight").get_dtype()
            cfg.dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(cfg.dtype, cfg.dtype)
        cfg.save_pretrained(str(root))
        return root

    def shutdown(self) -> None:
        """Kill the rank actors and drop their handles now, while this Ray session is alive."""
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        ray.util.remove_placement_group(self.placement)
