"""Process-group setup for the trainer: torch.distributed + Megatron parallel state.

gloo on CPU, nccl on GPU; everything else (TP / PP / EP / DP groups, seeds) is Megatron-core's own.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from megatron_glue import cpu_compat
from megatron_glue.model_provider import ParallelSizes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_rendezvous(master_addr: str, world_size: int, timeout_minutes: float = 30) -> dist.TCPStore:
    """Rank 0's rendezvous store on a port the OS assigns (port 0), to hand to the other ranks: a port picked
    free and bound later can be taken in between (EADDRINUSE under load)."""
    return dist.TCPStore(master_addr, 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(minutes=timeout_minutes))


def init_distributed(rank: int = 0, world_size: int = 1, master_addr: str | None = None, master_port: int | None = None,
                     store: dist.Store | None = None) -> None:
    """Join (or create) the default process group; a no-op if it already exists. `store`: rank 0's store from
    `host_rendezvous` (the others join its port)."""
    if dist.is_initialized():
        return
    if store is not None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        # the prefix torch adds to the store of an env:// or tcp:// rendezvous (the other ranks'), not to a given one
        dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size,
                                timeout=timedelta(minutes=30))
        return
    os.environ.setdefault("MASTER_ADDR", master_addr or "127.0.0.1")
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=30))


def collective_device(group: object = None) -> torch.device:
    """Where a tensor must live for a collective on `group`: NCCL moves CUDA tensors only, gloo CPU ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_model_parallel(sizes: ParallelSizes, seed: int = 0) -> None:
    """Megatron parallel groups (DP is whatever is left of the world) and the model-parallel RNG."""
    cpu_compat.apply()
    world = dist.get_world_size()
    model_parallel = sizes.tp * sizes.pp
    if world % model_parallel:
        raise ValueError(f"world size {world} is not divisible by TP x PP = {model_parallel}")
    if sizes.expert_tp not in (1, sizes.tp):
        raise ValueError(f"expert tensor-parallel size {sizes.expert_tp} is not supported: use 1 or the TP size {sizes.tp}")
    expert_group = sizes.ep * sizes.expert_tp
    if (world // sizes.pp) % expert_group:
        raise ValueError(f"expert parallel x expert tensor parallel = {sizes.ep} x {sizes.expert_tp} does not divide "
                         f"the {world // sizes.pp} ranks of a stage")
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=sizes.tp,
        pipeline_model_parallel_size=sizes.pp,
        expert_model_parallel_size=sizes.ep,
        expert_tensor_parallel_size=sizes.expert_tp,
    )
    model_parallel_cuda_manual_seed(seed)


def teardown() -> None:
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
