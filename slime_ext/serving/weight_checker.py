"""SGLang's `/weights_checker` on the project's server: snapshot, reset_tensors, compare, checksum.

Why: a trainer checks a refit the same way against real SGLang engines and this server. At a run's first
sync it snapshots the weights the engine loaded from the base checkpoint, resets them to random values, syncs
from the trainer ranks and compares (every tensor the sync missed or corrupted differs from its snapshot);
at every later sync it compares checksums across engines and with the senders'. Requests and answers follow
SGLang 0.5.21 (`io_struct.CheckWeightsReqInput` / `CheckWeightsReqOutput`, `utils.weight_checker`): a
checksum answer carries `ranks` (one `ChecksumInfo` per TP rank: this server has one) and
`per_engine_checksum`; a failed compare is a 400 naming the tensors.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from sglang_patches.weight_hash import overall_checksum, per_engine_checksum, tensor_hash_hex

# buffers SGLang skips: recomputed from the config, never loaded (weight_checker._NON_PERSISTENT_BUFFER_PATTERNS)
NON_PERSISTENT = ("cos_sin_cache", "cos_cache", "sin_cache", "inv_freq", "freqs_cis", "expert_mask_gpu")
ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")


class WeightCheckError(Exception):
    """A check that failed (compare found differences, compare before snapshot, unknown action)."""


class WeightChecker:
    def __init__(self, get_model: Any):
        self._get_model = get_model
        self._saved: Optional[dict[str, torch.Tensor]] = None

    def _state(self, skip: Optional[list[str]]) -> Iterator[tuple[str, torch.Tensor]]:
        model = self._get_model()
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if any(p in name for p in NON_PERSISTENT) or any(p in name for p in (skip or ())):
                continue
            yield name, tensor.data

    def handle(self, action: str, skip: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
        if action not in ACTIONS:
            raise WeightCheckError(f"Unsupported action={action!r} (one of {', '.join(ACTIONS)})")
        return getattr(self, f"_{action}")(skip)

    @torch.no_grad()
    def _snapshot(self, skip: Optional[list[str]]) -> None:
        self._saved = {name: t.detach().clone() for name, t in self._state(None)}

    @torch.no_grad()
    def _reset_tensors(self, skip: Optional[list[str]]) -> None:
        gen = torch.Generator().manual_seed(0)
        for _, t in self._state(skip):
            if t.dtype.is_floating_point:
                t.copy_(torch.rand(t.shape, generator=gen).to(t.dtype))
            elif t.dtype == torch.bool:
                t.copy_(torch.rand(t.shape, generator=gen) > 0.5)
            else:
                t.copy_(torch.randint(0, 1 << 7, t.shape, generator=gen).to(t.dtype))

    def _compare(self, skip: Optional[list[str]]) -> None:
        if self._saved is None:
            raise WeightCheckError("compare needs a snapshot first (action 'snapshot')")
        bad = []
        for name, t in self._state(skip):
            want = self._saved.get(name)
            if want is None or want.shape != t.shape or want.dtype != t.dtype:
                bad.append(f"name={name} (not in the snapshot, or its shape or dtype changed)")
            elif not torch.equal(want.view(-1).view(torch.uint8), t.contiguous().view(-1).view(torch.uint8)):
                diff = (want.float() - t.float()).abs()
                bad.append(f"name={name} max_abs_err={float(diff.max()):.4g} num_diff={int((diff != 0).sum())}")
        self._saved = None
        if bad:
            raise WeightCheckError("check tensor equality failed:\n" + "\n".join(bad))

    def _checksum(self, skip: Optional[list[str]]) -> dict[str, Any]:
        checksums = {name: tensor_hash_hex(t) for name, t in self._state(skip)}
        per_gpu = overall_checksum(checksums)
        info = {"checksums": checksums, "per_gpu_checksum": per_gpu,
                "parallelism_info": [{"role": "target", "tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1,
                                      "pp_rank": 0, "pp_size": 1, "rank": 0, "size": 1}]}
        return {"ranks": [info], "per_engine_checksum": per_engine_checksum([per_gpu])}


__all__ = ["WeightChecker", "WeightCheckError", "ACTIONS"]
