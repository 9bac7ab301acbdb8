"""Weight buckets as they travel to an engine: dense or sparse (delta) entries, each with a checksum.

Why: a sync that corrupts or drops part of a bucket must stop the run, not train on silently wrong
weights; and with bf16 engine weights a small optimizer step leaves most values unchanged, so sending
only the changed elements (with their indices) can cost far less than the dense tensor.

A payload is a plain list of (name, tensor) pairs, so it rides every transport that carries named tensors
(SGLang's `/update_weights_from_tensor`, a Ray object, a broadcast):
- `name`                      the new value, dense, in the engine's dtype;
- `name@idx`, `name@val`      a sparse delta: flat indices (int32/int64) and the new values there;
- `name@sum`                  a one-element int64: `checksum()` of the value the engine must hold after.
A name with only `@sum` is unchanged since the last sync (nothing to apply, still verified).

`apply_payload` applies and verifies through a `get_param(name)` callable (the engine's HF-named view of a
parameter). `load_payload(model, named_tensors)` is the same as an SGLang custom weight loader (server
flag `--custom-weight-loader sglang_patches.weight_payload.load_payload`, selected per request by
`load_format`). Plain torch: no sglang, no slime_ext.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch

IDX, VAL, SUM = "@idx", "@val", "@sum"
LOADER = "sglang_patches.weight_payload.load_payload"
_CHUNK = 1 << 22
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # bit-exact comparisons

Named = list[tuple[str, torch.Tensor]]


class ChecksumMismatch(ValueError):
    """The engine's weights after an update differ from what the trainer sent."""


_WEIGHTS: dict[str, torch.Tensor] = {}


def _chunk_weights(device: torch.device) -> torch.Tensor:
    """1..65521 repeating, one chunk long, made once per device (the position weights of `checksum`)."""
    key = str(device)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = (torch.arange(_CHUNK, device=device, dtype=torch.int64) % 65521 + 1).to(torch.int32)
    return _WEIGHTS[key]


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes as int32 words (int16 or bytes, widened, when the size is not a multiple of 4)."""
    raw = tensor.detach().contiguous().view(-1).view(torch.uint8)
    if raw.numel() % 4 == 0:
        return raw.view(torch.int32)
    if raw.numel() % 2 == 0:
        return raw.view(torch.int16).to(torch.int32)
    return raw.to(torch.int32)


def checksum(tensor: torch.Tensor) -> int:
    """Position-weighted sums of the raw bits, 32 bits at a time and per chunk, chained across chunks, as a
    signed 64-bit value: equal on every device for equal bits (the int32 products wrap the same way
    everywhere and integer sums do not depend on order), and different for a changed, swapped or missing
    element with overwhelming probability. About 1 GB/s on one CPU core."""
    words = _words(tensor)
    weights = _chunk_weights(words.device)
    total = 0
    for start in range(0, words.numel(), _CHUNK):
        part = words[start:start + _CHUNK]
        chunk_sum = int((part * weights[:part.numel()]).sum(dtype=torch.int64))
        total = (total * 1_000_003 + chunk_sum) % 2**64
    return total - 2**64 if total >= 2**63 else total


def _sum_entry(name: str, value: torch.Tensor) -> tuple[str, torch.Tensor]:
    return name + SUM, torch.tensor([checksum(value)], dtype=torch.int64)


def _bit_chunks(value: torch.Tensor, previous: torch.Tensor) -> Iterable[tuple[int, torch.Tensor]]:
    """(offset, changed mask) per `_CHUNK` elements, bit-exact. Chunked so that the comparison's temporaries
    (a bool mask, then int64 positions) stay bounded by the chunk instead of the tensor: on a large tensor a
    whole-tensor `nonzero` took 9 bytes per element beyond the bucket (the delta sender's peak, issue 26)."""
    int_dtype = _INT_VIEW[value.element_size()]
    new, old = value.view(-1).view(int_dtype), previous.detach().contiguous().view(-1).view(int_dtype)
    for start in range(0, new.numel(), _CHUNK):
        yield start, new[start:start + _CHUNK] != old[start:start + _CHUNK]


def _changed_counts(value: torch.Tensor, previous: torch.Tensor) -> list[int]:
    return [int(mask.sum()) for _, mask in _bit_chunks(value, previous)]


def _changed_index(value: torch.Tensor, previous: torch.Tensor, counts: list[int],
                   index_dtype: torch.dtype) -> torch.Tensor:
    """Flat positions whose bits changed, ascending, written chunk by chunk into their final dtype."""
    index = torch.empty(sum(counts), dtype=index_dtype)
    at = 0
    for (start, mask), count in zip(_bit_chunks(value, previous), counts):
        if count:
            index[at:at + count] = mask.nonzero().view(-1) + start
            at += count
    return index


def encode(name: str, value: torch.Tensor, previous: Optional[torch.Tensor]) -> tuple[Named, int]:
    """Payload entries for one tensor already in the engine's dtype, against `previous` (what the engine
    holds now; None = unknown: dense). Returns (entries, number of changed elements)."""
    value = value.detach().contiguous()
    entries: Named = []
    if previous is None or previous.shape != value.shape or previous.dtype != value.dtype:
        entries.append((name, value))
        changed = value.numel()
    else:
        index_dtype = torch.int32 if value.numel() < 2**31 else torch.int64
        counts = _changed_counts(value, previous)
        changed = sum(counts)
        sparse_bytes = changed * (index_dtype.itemsize + value.element_size())
        if sparse_bytes < value.numel() * value.element_size():
            if changed:
                index = _changed_index(value, previous, counts, index_dtype)
                entries += [(name + IDX, index), (name + VAL, value.view(-1)[index])]
        else:
            entries.append((name, value))
    entries.append(_sum_entry(name, value))
    return entries, changed


def payload_bytes(payload: Iterable[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in payload)


def _group(payload: Iterable[tuple[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in payload:
        for suffix in (IDX, VAL, SUM):
            if key.endswith(suffix):
                parts.setdefault(key[: -len(suffix)], {})[suffix] = tensor
                break
        else:
            parts.setdefault(key, {})[""] = tensor
    return parts


def check_payload(payload: Iterable[tuple[str, torch.Tensor]], get_param: Callable[[str], torch.Tensor]) -> None:
    """Names, shapes and index ranges, before anything is written (KeyError / ValueError)."""
    for name, part in _group(payload).items():
        dst = get_param(name)
        if "" in part and tuple(part[""].shape) != tuple(dst.shape):
            raise ValueError(f"weight update: {name!r} has shape {tuple(part[''].shape)}, model expects "
                             f"{tuple(dst.shape)}")
        if (IDX in part) != (VAL in part):
            raise ValueError(f"weight update: {name!r} has {IDX if IDX in part else VAL} without its pair")
        if IDX in part:
            index = part[IDX]
            if index.numel() != part[VAL].numel():
                raise ValueError(f"weight update: {name!r} has {index.numel()} indices and {part[VAL].numel()} values")
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= dst.numel()):
                raise ValueError(f"weight update: {name!r} has indices outside [0, {dst.numel()})")


@torch.no_grad()
def apply_payload(payload: Iterable[tuple[str, torch.Tensor]], get_param: Callable[[str], torch.Tensor]) -> int:
    """Write every entry into the parameter `get_param(name)` returns (a view into the model), then verify
    every checksum; raises ChecksumMismatch naming the first bad tensor. Returns the tensors verified."""
    parts = _group(payload)
    for name, part in parts.items():
        dst = get_param(name)
        if "" in part:
            dst.copy_(part[""].to(device=dst.device, dtype=dst.dtype))
        elif IDX in part:
            index = part[IDX].to(device=dst.device, dtype=torch.int64)
            values = part[VAL].to(device=dst.device, dtype=dst.dtype)
            if dst.is_contiguous():
                dst.view(-1)[index] = values
            else:  # an expert slice of a fused tensor: write through a copy
                flat = dst.reshape(-1).clone()
                flat[index] = values
                dst.copy_(flat.view_as(dst))
    verified = 0
    for name, part in parts.items():
        if SUM in part:
            got, want = checksum(get_param(name)), int(part[SUM].view(-1)[0])
            if got != want:
                raise ChecksumMismatch(f"weight update: {name!r} fails its checksum after applying the bucket "
                                       f"(engine {got:#x}, trainer {want:#x}): the update is corrupt or partial")
            verified += 1
    return verified


def load_payload(model: torch.nn.Module, named_tensors: Named) -> None:
    """SGLang custom weight loader: the payload applied to parameters found by their HF names. SGLang models
    that fuse projections (qkv, gate_up, experts) have no HF-named parameter to take a sparse delta; for
    those the error names the tensor (send it dense: `sglang.weight_sync_delta: false`)."""
    params = dict(model.named_parameters())

    def get(name: str) -> torch.Tensor:
        if name not in params:
            raise KeyError(f"{name!r} is not an HF-named parameter of this model (fused in SGLang's model?): "
                           f"set sglang.weight_sync_delta=false")
        return params[name].data

    check_payload(named_tensors, get)
    apply_payload(named_tensors, get)


__all__ = ["encode", "apply_payload", "check_payload", "checksum", "load_payload", "payload_bytes",
           "ChecksumMismatch", "LOADER", "IDX", "VAL", "SUM"]
