"""Engines as Ray actors, and a synchronous proxy so callers use one interface for local or remote."""

from __future__ import annotations

import dataclasses

import os
from typing import Any, Iterable, Optional

import torch

from slime_ext.engine.embedded import EmbeddedEngine


class EmbeddedEngineActor(EmbeddedEngine):
    """An embedded engine loaded from an HF checkpoint directory inside a Ray actor process."""

    def __init__(self, path: str, threads: int = 1, partner_path: Optional[str] = None, dtype: str = "float32",
                 kernel: str = "auto"):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        engine = EmbeddedEngine.from_pretrained(path, partner_path=partner_path, dtype=getattr(torch, dtype))
        super().__init__(engine.model, engine.eos_token_id, partner=engine.partner, decode=engine.decode, kernel=kernel)

    def set_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)


def name_adapter(requests: list, lora_name: Optional[str]) -> list:
    """The requests naming the run's LoRA adapter (those naming none); unchanged without one."""
    if lora_name is None:
        return requests
    return [r if r.lora_name is not None else dataclasses.replace(r, lora_name=lora_name) for r in requests]


class RemoteEngine:
    """Calls a Ray engine actor synchronously, exposing the engine interface."""

    def __init__(self, handle: Any, lora_name: Optional[str] = None):
        self.handle = handle
        self.lora_name = lora_name  # the adapter every request names (train.lora.sync: adapter); None: the model

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)

    def generate(self, requests: list) -> list:
        return self._get(self.handle.generate.remote(name_adapter(requests, self.lora_name)))

    def abort(self, rid: str) -> None:
        self._get(self.handle.abort.remote(rid))

    def flush_cache(self) -> None:
        self._get(self.handle.flush_cache.remote())

    def score(self, sequences: list[list[int]], starts: list[int], model: str = "partner") -> list[list[float]]:
        return self._get(self.handle.score.remote(sequences, starts, model))

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._get(self.handle.update_weights_from_tensor.remote(list(named_tensors)))

    def release_memory_occupation(self) -> None:
        self._get(self.handle.release_memory_occupation.remote())

    def resume_memory_occupation(self) -> None:
        self._get(self.handle.resume_memory_occupation.remote())

    def metrics(self) -> dict:
        return self._get(self.handle.metrics.remote())
