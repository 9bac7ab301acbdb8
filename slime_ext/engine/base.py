"""The engine interface shared by the embedded engine and the SGLang client.

Engines take token ids and return token ids (never re-tokenising between turns: prefix caches only hit
on identical ids), with per-token logprobs and the annotations the request's samplers produced.
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from slime_ext.data.generation import GenerateRequest, GenerateResult

class RolloutEngine(Protocol):
    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]: ...

    def abort(self, rid: str) -> None: ...

    def flush_cache(self) -> None: ...

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def release_memory_occupation(self) -> None: ...

    def resume_memory_occupation(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...
