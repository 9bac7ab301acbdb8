"""When torch's grouped matmul can run, shared by the engine's static-KV forward and the trainer's experts.

`torch.nn.functional.grouped_mm` multiplies row blocks of one matrix by one weight each (a MoE layer's
experts in one call instead of a Python loop): fp32 on the CPU, bf16 on Hopper or newer GPUs, with every
row stride a multiple of 16 bytes. Its backward needs a dense (contiguous) output gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_mm_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `grouped_mm(x, weight.transpose(1, 2))` takes these operands ([rows, in] x [E, out, in])."""
    if not hasattr(F, "grouped_mm") or x.dtype != weight.dtype:
        return False
    if not all(n * x.element_size() % 16 == 0 for n in (x.shape[1], weight.shape[1])):
        return False
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9
    return x.dtype == torch.float32


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """y[i] = x[i] @ W[e(i)].T for rows sorted by expert, `offsets` the int32 cumulative row counts; differentiable
    (the output gradient is made dense first, as grouped_mm's backward requires)."""
    out = F.grouped_mm(x, weight.transpose(1, 2), offs=offsets)
    if out.requires_grad:
        out.register_hook(lambda grad: grad.contiguous())
    return out
