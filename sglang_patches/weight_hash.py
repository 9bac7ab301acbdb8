"""Weight checksums as SGLang's `/weights_checker` computes them on CPU tensors, so a sender and an engine agree.

SGLang 0.5.21 (`sglang.srt.utils.weight_checker`): each tensor's checksum is `tensor_hash` (on CPU: the first 8
bytes of the SHA-256 of its raw bytes, big-endian, as 16 hex digits; on GPU a Triton hash, which no CPU process
reproduces), a rank's `per_gpu_checksum` is the SHA-256 over its (name, checksum) pairs in name order, and an
engine's `per_engine_checksum` the SHA-256 over its ranks' `per_gpu_checksum`s. Plain torch and hashlib: the
project's server and the senders use it without importing sglang; tests hold it to sglang's own functions.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

import torch


def tensor_hash_hex(tensor: torch.Tensor) -> str:
    """SGLang's CPU `tensor_hash` of one tensor, as `weight_checker._hash_tensor` formats it."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.sha256(memoryview(raw.numpy())).digest()[:8]
    return f"{int.from_bytes(digest, byteorder='big', signed=False):016x}"


def overall_checksum(checksums: Mapping[str, str]) -> str:
    """A rank's `per_gpu_checksum`."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def per_engine_checksum(per_gpu_checksums: Iterable[str]) -> str:
    """An engine's `per_engine_checksum` over its ranks' `per_gpu_checksum`s, in rank order."""
    h = hashlib.sha256()
    for value in per_gpu_checksums:
        h.update(value.encode())
    return h.hexdigest()


__all__ = ["tensor_hash_hex", "overall_checksum", "per_engine_checksum"]
