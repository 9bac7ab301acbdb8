"""Per-token log-probabilities and entropy from vocabulary-parallel logits.

With tensor parallelism each rank holds logits for a slice of the vocabulary (`parallel_output=True`):
gathering full logits would cost `tokens x vocab` memory per rank (12 GB in fp32 for 20k tokens of
Qwen3's 151936-entry vocabulary). Instead the softmax normaliser and the target logit are summed across
the TP group with Megatron's `reduce_from_tensor_model_parallel_region`: all-reduce forward, identity
backward. Every TP rank computes the same (replicated) loss, and each shard's gradient must come from
its own rank's copy only; an autograd all-reduce would sum the TP copies and scale grads by tp.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def _tp_group() -> Optional[dist.ProcessGroup]:
    if mpu.get_tensor_model_parallel_world_size() == 1:
        return None
    return mpu.get_tensor_model_parallel_group()


def vocab_parallel_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log p(target) and (optionally) the entropy for every position.

    `logits`: `[..., V / tp]` this rank's vocabulary shard (rank r holds ids [r V/tp, (r+1) V/tp)).
    `targets`: `[...]` global token ids. Computed in fp32.
    """
    group = _tp_group()
    logits = logits.float()
    local_vocab = logits.shape[-1]
    start = mpu.get_tensor_model_parallel_rank() * local_vocab if group is not None else 0

    with torch.no_grad():
        max_logit = logits.max(dim=-1, keepdim=True).values
        if group is not None:
            dist.all_reduce(max_logit, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - max_logit
    exp = shifted.exp()
    sum_exp = exp.sum(dim=-1)
    local_target = targets - start
    in_shard = (local_target >= 0) & (local_target < local_vocab)
    picked = shifted.gather(-1, local_target.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    picked = torch.where(in_shard, picked, torch.zeros_like(picked))
    if group is not None:
        sum_exp = reduce_from_tensor_model_parallel_region(sum_exp)
        picked = reduce_from_tensor_model_parallel_region(picked)
    log_z = sum_exp.log()
    logprobs = picked - log_z
    entropy = None
    if with_entropy:
        # H = log Z - E_p[shifted logit]
        expected = (exp * shifted).sum(dim=-1)
        if group is not None:
            expected = reduce_from_tensor_model_parallel_region(expected)
        entropy = log_z - expected / sum_exp
    return logprobs, entropy
