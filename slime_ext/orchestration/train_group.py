"""The train actor group: one Ray actor per megatron_glue rank, driven in lockstep from the driver.

Placement follows the cluster config: on a CPU machine all ranks share one node (gloo, no GPU
bundles); on a GPU cluster each rank gets a `{"GPU": 1}` bundle of one placement group (NCCL), packed
node by node, as slime places its train actors.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import ray
import torch

from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.model_provider import ParallelSizes
from slime_ext.orchestration.placement import ActorGroup, Placement, ray_options


class TrainWorker:
    """One trainer rank (runs inside a Ray actor process)."""

    def __init__(self, rank: int, world: int, master_addr: str, master_port: int, threads: int):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        from megatron_glue.parallel import init_distributed

        self.rank = rank
        init_distributed(rank, world, master_addr, master_port)
        self.trainer: Optional[MegatronTrainer] = None

    def setup(self, hf_config: Any, settings: dict, sizes: dict, pad_id: int, hf_dir: Optional[str]) -> None:
        from megatron_glue.parallel import init_model_parallel

        parallel = ParallelSizes(**sizes)
        init_model_parallel(parallel, seed=settings["seed"])
        self.trainer = MegatronTrainer(hf_config, TrainerSettings(**settings), parallel, pad_id=pad_id)
        if hf_dir is not None:
            self.load_hf(hf_dir)

    def load_hf(self, hf_dir: str) -> None:
        """Load this rank's shard of an HF checkpoint (reads only the tensors this rank holds)."""
        from megatron.core import parallel_state as mpu

        from megatron_glue.checkpoint_io import load_hf_checkpoint
        from megatron_glue.sharding import shard_megatron_state
        from megatron_glue.weight_names import hf_to_megatron

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

    def train_step(self, samples: list, kind: str, ref_logprobs: Optional[dict] = None) -> dict:
        return self.trainer.train_step(samples, kind=kind, ref_logprobs=ref_logprobs)

    def compute_logprobs(self, samples: list, reference: bool = False) -> Optional[dict]:
        return self.trainer.compute_logprobs(samples, reference=reference)

    def snapshot_reference(self) -> None:
        self.trainer.snapshot_reference()

    def export_hf(self) -> list[tuple[str, torch.Tensor]]:
        """HF-named weights of this rank's pipeline stage, returned by the stage's TP/EP/DP rank 0."""
        from megatron.core import parallel_state as mpu

        from megatron_glue.weight_export import export_hf_state_dict

        tensors = export_hf_state_dict(self.trainer)
        exporter = (mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_expert_model_parallel_rank() == 0
                    and mpu.get_data_parallel_rank() == 0)
        return list(tensors.items()) if exporter else []

    def save(self, directory: str, extra: dict) -> str:
        from megatron_glue.trainer_checkpoint import save_checkpoint

        return str(save_checkpoint(self.trainer, directory, extra))

    def load(self, directory: str) -> dict:
        from megatron_glue.trainer_checkpoint import load_checkpoint

        return load_checkpoint(self.trainer, directory)

    def step_count(self) -> int:
        return self.trainer.step


class TrainGroup:
    """Driver-side handle: creates the rank actors and calls them in lockstep."""

    def __init__(self, actors: ActorGroup, placement: Placement, threads: int, master_addr: str = "127.0.0.1"):
        """One rank actor per `actors.count`, each in its bundle of one placement group (`placement`)."""
        from megatron_glue.parallel import free_port

        self.world = world = actors.count
        port = free_port()
        self.placement = ray.util.placement_group([dict(placement.bundle) for _ in range(placement.num_bundles)],
                                                  strategy=placement.strategy)
        ray.get(self.placement.ready())
        actor_cls = ray.remote(TrainWorker)
        env = {"env_vars": {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}}
        self.workers = [
            actor_cls.options(
                **ray_options(actors),
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    placement_group=self.placement, placement_group_bundle_index=actors.bundles[rank][0]),
                runtime_env=env,
            ).remote(rank, world, master_addr, port, threads)
            for rank in range(world)
        ]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def first(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call every rank; return the first non-None result (the output rank's)."""
        return next((r for r in self.call(method, *args, **kwargs) if r is not None), None)

    def setup(self, hf_config: Any, settings: TrainerSettings, sizes: ParallelSizes, pad_id: int,
              hf_dir: Optional[str | Path]) -> None:
        self.call("setup", hf_config, asdict(settings), asdict(sizes), pad_id, str(hf_dir) if hf_dir else None)

    def export_hf(self) -> list[tuple[str, torch.Tensor]]:
        merged: list[tuple[str, torch.Tensor]] = []
        for part in self.call("export_hf"):
            merged.extend(part)
        return merged

    def shutdown(self) -> None:
        """Kill the rank actors and drop their handles now, while this Ray session is alive."""
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        ray.util.remove_placement_group(self.placement)
