"""Per-token log-probabilities and entropy straight from the LM head, a chunk of tokens at a time.

The full logits are `[tokens, vocab / tp]`: at Qwen3's 151,936-entry vocabulary and 16k tokens that is ~10 GB
per fp32 copy, and a plain log-softmax keeps several copies for backward. Here the trainer's forward stops
before the output projection (`DeferredLMHead`), and `chunked_logprobs` projects, normalises, picks the target
and takes the entropy for `chunk` tokens at a time; backward recomputes each chunk's logits instead of keeping
them. Peak memory beyond the activations is a few copies of one chunk's fp32 logits (`train.logprob_chunk_mb`).

Tensor parallelism: each rank holds the weight rows of one vocabulary slice (rank r: ids [r V/tp, (r+1) V/tp)).
The max, the normaliser, the target logit and the entropy's expectation are all-reduced per chunk; every TP
rank then holds the same (replicated) log-probs, and each rank's backward gives the gradient of its own
slice only. The input's gradient is a partial sum over the slices, which the TP region mapping of the head's
input (all-reduce, or reduce-scatter with sequence parallelism) completes, as Megatron's column-parallel
linear does.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)

from megatron_glue.logprob_chunks import DEFAULT_CHUNK_MB, tokens_per_chunk


def _tp_group() -> Optional[dist.ProcessGroup]:
    if not mpu.model_parallel_is_initialized() or mpu.get_tensor_model_parallel_world_size() == 1:
        return None
    return mpu.get_tensor_model_parallel_group()


def _target_columns(targets: torch.Tensor, start: int, local_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(column of each target in this rank's slice, clamped; whether the target is in the slice)."""
    local = targets - start
    in_slice = (local >= 0) & (local < local_vocab)
    return local.clamp(0, local_vocab - 1), in_slice


class _ChunkedLogprobs(torch.autograd.Function):
    """log p(target) and entropy per row of `hidden` ([N, h]) under `weight` ([V/tp, h]); see the module doc."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                with_entropy: bool, group: Optional[dist.ProcessGroup], start: int,
                into_main_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n, local_vocab = hidden.shape[0], weight.shape[0]
        cols, in_slice = _target_columns(targets, start, local_vocab)
        log_z = hidden.new_empty(n, dtype=torch.float32)  # global log-sum-exp of the logits
        logprobs = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_zeros(n, dtype=torch.float32)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            shifted = (hidden[lo:hi] @ weight.t()).float()
            top = shifted.max(dim=-1).values
            if group is not None:
                dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            shifted -= top[:, None]
            picked = shifted.gather(1, cols[lo:hi, None]).squeeze(1) * in_slice[lo:hi]
            exp = shifted.exp()
            sums = [exp.sum(dim=-1), picked]
            if with_entropy:
                sums.append((exp * shifted).sum(dim=-1))  # sum_j e^{z_j} z_j, shifted
            del exp, shifted
            sums = torch.stack(sums)
            if group is not None:
                dist.all_reduce(sums, group=group)
            log_sum = sums[0].log()
            logprobs[lo:hi] = sums[1] - log_sum
            log_z[lo:hi] = top + log_sum
            if with_entropy:  # H = log Z - E_p[z], both shifted
                entropy[lo:hi] = log_sum - sums[2] / sums[0]
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.chunk, ctx.group, ctx.start, ctx.into_main_grad = chunk, group, start, into_main_grad
        ctx.set_materialize_grads(False)  # an unused entropy arrives as None: its gradient work is skipped
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Optional[torch.Tensor],
                 grad_entropy: Optional[torch.Tensor]) -> tuple[Optional[torch.Tensor], ...]:
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        n, local_vocab = hidden.shape[0], weight.shape[0]
        cols, in_slice = _target_columns(targets, ctx.start, local_vocab)
        g_lp = grad_logprobs if grad_logprobs is not None else hidden.new_zeros(n, dtype=torch.float32)
        g_ent = grad_entropy
        grad_hidden = torch.empty_like(hidden)
        # Megatron's DDP accumulates into fp32 `main_grad`; adding there per chunk (as its fused weight-gradient
        # path does) avoids a second [V/tp, h] accumulator. Without DDP (plain modules): an fp32 accumulator.
        grad_weight = weight.main_grad if ctx.into_main_grad else torch.zeros_like(weight, dtype=torch.float32)
        for lo in range(0, n, ctx.chunk):
            hi = min(n, lo + ctx.chunk)
            h = hidden[lo:hi]
            log_p = (h @ weight.t()).float()
            log_p -= log_z[lo:hi, None]
            probs = log_p.exp()
            # d log p(t) / dz_j = [j = t] - p_j;  dH / dz_j = -p_j (log p_j + H)
            coef = g_lp[lo:hi, None]
            if g_ent is not None:
                log_p += entropy[lo:hi, None]
                log_p *= g_ent[lo:hi, None]
                coef = coef + log_p
            del log_p
            grad_z = probs.mul_(coef).neg_()
            grad_z.scatter_add_(1, cols[lo:hi, None], (g_lp[lo:hi] * in_slice[lo:hi])[:, None])
            grad_z = grad_z.to(hidden.dtype)
            grad_hidden[lo:hi] = grad_z @ weight
            if grad_weight.dtype == grad_z.dtype:
                grad_weight.addmm_(grad_z.t(), h)
            else:  # bf16 GEMM, fp32 sum over chunks (an fp32 GEMM would be several times slower on GPUs)
                grad_weight += grad_z.t() @ h
        if ctx.into_main_grad:
            weight.grad_added_to_main_grad = True
            grad_weight = torch.empty_like(weight)  # a placeholder, as Megatron's fused path returns
        else:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False,
                     chunk_mb: float = DEFAULT_CHUNK_MB,
                     weight_is_shared: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log p(target) (and entropy) for every position, fp32, shape of `targets`.

    `hidden`: `[..., h]` the LM head's input (already TP-replicated, see `DeferredLMHead`); `weight`:
    `[V/tp, h]` this rank's vocabulary slice of the head; `targets`: `[...]` global token ids.
    `weight_is_shared`: the weight also gets gradients elsewhere (a tied input embedding)."""
    group = _tp_group()
    local_vocab = weight.shape[0]
    start = mpu.get_tensor_model_parallel_rank() * local_vocab if group is not None else 0
    # Megatron's fused-gradient contract: add into main_grad when DDP set it up and nothing else feeds this
    # parameter's grad (a tied embedding also gets the lookup's gradient through `.grad`).
    into_main_grad = (torch.is_grad_enabled() and weight.requires_grad and hasattr(weight, "main_grad")
                      and hasattr(weight, "grad_added_to_main_grad") and not weight_is_shared)
    shape = targets.shape
    lp, ent = _ChunkedLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1),
                                     tokens_per_chunk(local_vocab, chunk_mb), with_entropy, group, start,
                                     into_main_grad)
    return lp.view(shape), (ent.view(shape) if with_entropy else None)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: GPTModel transposes the head's output, and
    Megatron's `_reduce` all-reduces `grad.contiguous()`, a copy, when the gradient is a transposed view."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class DeferredLMHead:
    """Makes a GPTModel's output layer hand back its input while `deferred()` is active, so the loss can
    project in chunks (`chunked_logprobs`). Outside it the layer computes logits as usual (evaluation code and
    tests that call the model directly). The instance's `forward` is replaced, so parameter names are unchanged.
    """

    def __init__(self, model: torch.nn.Module):
        self.layer = model.output_layer
        # tied and on the embedding's stage: the head's weight is the input embedding's (one parameter)
        self.tied = bool(getattr(model, "share_embeddings_and_output_weights", False) and model.pre_process)
        self.chunk_mb = DEFAULT_CHUNK_MB
        self.weight: Optional[torch.Tensor] = None
        self._active = False
        self._layer_forward = self.layer.forward
        self.layer.forward = types.MethodType(self._forward, self.layer)

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor,
                 with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """`chunked_logprobs` of the hidden states the last deferred forward returned."""
        if self.weight is None:
            raise RuntimeError("no deferred forward ran: call the model inside `deferred()` first")
        return chunked_logprobs(hidden, self.weight, targets, with_entropy, self.chunk_mb, self.tied)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._active, self.weight = True, None
        try:
            yield
        finally:
            self._active = False

    def _forward(self, layer: torch.nn.Module, hidden: torch.Tensor, weight: Optional[torch.Tensor] = None,
                 runtime_gather_output: Optional[bool] = None) -> tuple[torch.Tensor, None]:
        if not self._active:
            return self._layer_forward(hidden, weight=weight, runtime_gather_output=runtime_gather_output)
        self.weight = weight if weight is not None else layer.weight
        # the column-parallel linear's input mapping: gather the sequence shards, or all-reduce the input grad
        if layer.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
        elif mpu.get_tensor_model_parallel_world_size() > 1:
            hidden = copy_to_tensor_model_parallel_region(hidden)
        return _ContiguousGrad.apply(hidden), None
