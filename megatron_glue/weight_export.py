"""Weights out: the trainer's current parameters as canonical HF-named tensors, in buckets.

This is what an inference engine's weight update consumes (SGLang `update_weights_from_tensor`, the
embedded engine's in-place update). Each rank iterates its parameters in an order shared by its TP and
EP peers, all-gathers TP shards and expert slots in lockstep, and converts every full tensor to its HF
pieces. Every rank of a pipeline stage ends with the same buckets; each stage yields its own layers
(stage 0 the embedding, the last stage the final norm and LM head), so the union over stages is the
whole model. Memory stays bounded by the bucket size, not the model size.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu

from megatron_glue.trainer import MegatronTrainer
from megatron_glue.sharding import expert_full_name, own_storage, rank_parameters, tp_join
from megatron_glue.weight_names import megatron_param_to_hf

Bucket = list[tuple[str, torch.Tensor]]


def _all_gather(tensor: torch.Tensor, group: Any, size: int) -> list[torch.Tensor]:
    if size == 1:
        return [tensor]
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def sends_dense() -> bool:
    """The rank that sends its pipeline stage's dense part (TP, EP and DP rank 0) and, without expert senders,
    every expert gathered over EP too: every rank of a stage could, one is enough."""
    return (mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_expert_model_parallel_rank() == 0
            and mpu.get_data_parallel_rank() == 0)


def sends_own_experts() -> bool:
    """With expert senders: the rank that sends its EP rank's experts (expert-TP and expert-DP rank 0)."""
    return mpu.get_expert_tensor_parallel_rank() == 0 and mpu.get_expert_data_parallel_rank() == 0


def is_bucket_sender(expert_senders: bool = False) -> bool:
    """True on a rank that sends buckets: one per pipeline stage, or with `expert_senders` also one per EP rank
    (each its own experts, so a stage's bytes leave over as many links as it has EP ranks)."""
    return sends_dense() or (expert_senders and sends_own_experts())


def sender_key(expert_senders: bool = False) -> str:
    """Names this rank's sender (file names, weight-update group names)."""
    key = f"pp{mpu.get_pipeline_model_parallel_rank()}"
    return f"{key}_ep{mpu.get_expert_model_parallel_rank()}" if expert_senders else key


def _bucket_tensor(tensor: torch.Tensor, gathered: bool, to_host: bool) -> torch.Tensor:
    """The bucket's own copy of one HF piece. A piece of a gathered tensor that owns its whole storage is new
    memory already and is kept as it is (a second copy would double the largest transient of a sync: the
    gathered embedding or LM head); anything else (a parameter itself, or a view into a gathered tensor) is
    copied, never aliased: the trainer updates its parameters in place."""
    device = torch.device("cpu") if to_host else tensor.device
    tensor = tensor.detach()
    if gathered and tensor.device == device and own_storage(tensor) is tensor:
        return tensor
    return tensor.to(device, copy=True).contiguous()


def _add_pieces(bucket: Bucket, pieces: list[tuple[str, torch.Tensor]], gathered: bool, to_host: bool,
                alias: bool = False) -> int:
    """Appends one full tensor's HF pieces to the bucket; returns their bytes. `alias`: pieces of a tensor
    nobody changes while the bucket lives (a delta sender's held copy) go in as they are, on their device."""
    added = 0
    for hf_name, piece in pieces:
        if alias:
            bucket.append((hf_name, piece.detach().to("cpu") if to_host else piece.detach()))
        else:
            bucket.append((hf_name, _bucket_tensor(piece, gathered, to_host)))
        added += piece.numel() * piece.element_size()
    return added


def _iter_buckets(trainer: MegatronTrainer, sources: list[Mapping[str, torch.Tensor]], bucket_bytes: int,
                  to_host: bool, collect: bool, own_experts: Optional[bool] = None) -> Iterator[list[Bucket]]:
    """One bucket per source for each stretch of parameters: every source is a state dict in this rank's
    local names (the trainer's own, or a copy of it), gathered and converted the same way, so the buckets
    hold the same HF names in the same order. Sizes are counted over every source: what one stretch holds
    in all its buckets together stays within `bucket_bytes` (a delta sender's weights and the engines' values
    for them share one bucket's bound, so encoding the delta beside them keeps the sender within two)."""
    sizes = trainer.sizes
    ep_rank, pp_rank = mpu.get_expert_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank()
    buckets: list[Bucket] = [[] for _ in sources]
    filled = 0
    for param in rank_parameters(trainer.hf_config, ep_rank, sizes.ep, pp_rank, sizes.pp):
        expert = param.expert_slot is not None
        if not expert:
            tp_group, ways = mpu.get_tensor_model_parallel_group(), sizes.tp
        else:  # experts are split over the expert-TP group (1: whole on every TP rank)
            tp_group, ways = mpu.get_expert_tensor_parallel_group(), sizes.expert_tp
        joined = param.tp_split and ways > 1
        # expert senders (`own_experts` given): no EP gather, each EP rank's sender keeps its own experts
        spread = expert and sizes.ep > 1 and own_experts is None
        take = collect if own_experts is None else (own_experts if expert else collect)
        incoming = (ways if joined else 1) * (sizes.ep if spread else 1) * sum(
            source[param.local_name].nbytes for source in sources)
        if take and buckets[0] and filled + incoming > bucket_bytes:
            yield buckets
            buckets, filled = [[] for _ in sources], 0
        for i, source in enumerate(sources):
            tensor = source[param.local_name].detach()
            if joined:
                parts = _all_gather(tensor, tp_group, ways)
                # a rank that sends nothing needs the joined tensor only as its part of an expert gather
                tensor = tp_join(param.full_name, parts, trainer.hf_config) if take or spread else parts[0]
                del parts
            if spread:
                owners = _all_gather(tensor, mpu.get_expert_model_parallel_group(), sizes.ep)
                named = [(expert_full_name(param.full_name, trainer.hf_config, r, sizes.ep), t)
                         for r, t in enumerate(owners)]
                del owners
            else:
                named = [(param.full_name, tensor)]
            del tensor
            if not take:
                continue
            named.reverse()
            while named:  # each gathered tensor is dropped once its pieces are in the bucket
                full_name, full = named.pop()
                added = _add_pieces(buckets[i], megatron_param_to_hf(full_name, full, trainer.hf_config),
                                    joined or spread, to_host, alias=i > 0)
                filled += added
                del full
        if filled >= bucket_bytes:
            yield buckets
            buckets, filled = [[] for _ in sources], 0
    if buckets[0]:
        yield buckets


def iter_hf_weight_buckets(trainer: MegatronTrainer, bucket_bytes: int = 512 << 20,
                           to_host: bool = True, collect: bool = True,
                           own_experts: Optional[bool] = None) -> Iterator[Bucket]:
    """Yield lists of (HF name, full tensor) of at most `bucket_bytes` (a single tensor larger than that is a
    bucket of its own). Collective: every rank of the trainer must consume the iterator to the end.
    `to_host=False` keeps the copies on the device the parameters live on (an NCCL broadcast reads them
    there); the host gets them otherwise. `collect=False` (a rank that sends nothing) takes part in the
    gathers and yields nothing: no copies, no buckets.

    A bucket is handed out *before* the gather of the tensor that would overflow it, so while the consumer
    sends it the generator holds no gathered tensor: the sender's peak is one bucket plus what sending it
    takes, never a bucket plus a gathered tensor plus its copy.

    `own_experts` (expert senders; None: off): experts are not gathered over EP, and this rank's buckets hold
    its own EP rank's experts when `own_experts` is true and the dense part when `collect` is."""
    for (bucket,) in _iter_buckets(trainer, [trainer.local_state_dict()], bucket_bytes, to_host, collect,
                                   own_experts):
        yield bucket


def iter_hf_weight_bucket_pairs(trainer: MegatronTrainer, held: Mapping[str, torch.Tensor],
                                bucket_bytes: int = 512 << 20, to_host: bool = True,
                                collect: bool = True) -> Iterator[tuple[Bucket, Bucket]]:
    """As `iter_hf_weight_buckets`, each bucket paired with the same HF pieces of `held`: this rank's copy
    of what the engines hold of its own shard (local names, the engines' dtype), gathered the same way. Why:
    a delta sender needs the engines' values only for the bucket in hand, so each rank keeps a copy of its
    own shard and the sender never holds a copy of the whole stage. A pair together holds at most
    `bucket_bytes` (fp32 weights with bf16 values: two thirds and one third). Collective like the other."""
    for bucket, before in _iter_buckets(trainer, [trainer.local_state_dict(), held], bucket_bytes, to_host,
                                        collect):
        yield bucket, before


def all_ranks_agree(flag: bool) -> bool:
    """True when `flag` is true on every rank of the trainer (one all-reduce; the flag itself without a
    process group): ranks that walk their buckets together must take the same branch."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def export_hf_state_dict(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    """This stage's weights as one HF-named dict (tests, small models, checkpoint export)."""
    out: dict[str, torch.Tensor] = {}
    for bucket in iter_hf_weight_buckets(trainer):
        out.update(bucket)
    return out
