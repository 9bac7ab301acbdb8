"""A LoRA adapter served by merging it into the engine's weights, one adapter at a time: SGLang's
`/load_lora_adapter_from_tensors` (PEFT names and `adapter_config.json` as `config_dict`) and
`/unload_lora_adapter` for the embedded engine and the project's server.

Why merge: with one adapter live, W_base + (lora_alpha / r) B A applied to x is the served output SGLang's LoRA
kernels compute (base + B A x), with no per-request kernel; the base of every module an adapter touched is kept
from its first load, so a new version replaces the old one exactly and an unload restores the base. A request
that names another adapter (or none while one is loaded) is refused: the merged weights serve one.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

PEFT_PREFIX = "base_model.model."


def peft_modules(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF module name -> (A [r, in], B [out, r]) from PEFT tensor names; a name of another form, a module with
    only one of A and B, or ranks that disagree raise ValueError naming it."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        body = name.removeprefix(PEFT_PREFIX)
        for which in ("lora_A", "lora_B"):
            if body.endswith(f".{which}.weight"):
                parts.setdefault(body.removesuffix(f".{which}.weight"), {})[which] = tensor
                break
        else:
            raise ValueError(f"LoRA adapter: {name!r} is not a PEFT lora_A / lora_B weight")
    out = {}
    for module, pair in parts.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter: {module} has {sorted(pair)} only; both lora_A and lora_B are needed")
        a, b = pair["lora_A"], pair["lora_B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"LoRA adapter: {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                             "share a rank")
        out[module] = (a, b)
    return out


class MergedLoRA:
    """The adapter an engine serves (its name, or None) and the base weights of the modules adapters touched."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.base: dict[str, torch.Tensor] = {}

    def load(self, engine: Any, name: str, config: dict, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Merge `named` into `engine` (which has `parameter(hf_name)` and `update_weights_from_tensor`); returns
        the modules it sets. Every module a previous adapter touched and this one does not gets its base back."""
        if not name:
            raise ValueError("LoRA adapter: lora_name is empty")
        try:
            scale = float(config["lora_alpha"]) / float(config["r"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise ValueError("LoRA adapter: config_dict needs PEFT's lora_alpha and r (adapter_config.json)") from None
        modules = peft_modules(named)
        if not modules:
            raise ValueError(f"LoRA adapter {name!r} holds no tensors")
        updates = []
        for module, (a, b) in modules.items():
            weight = f"{module}.weight"
            base = self.base.get(weight)
            if base is None:
                base = self.base[weight] = engine.parameter(weight).detach().clone()  # KeyError: not in the model
            if tuple(base.shape) != (b.shape[0], a.shape[1]):
                raise ValueError(f"LoRA adapter: {module}: B A is {b.shape[0]} x {a.shape[1]}, the weight "
                                 f"{tuple(base.shape)}")
            updates.append((weight, base + scale * (b.float() @ a.float()).to(base.dtype)))
        touched = {w for w, _ in updates}
        updates += [(w, base) for w, base in self.base.items() if w not in touched]
        engine.update_weights_from_tensor(updates)
        self.name = name
        return len(modules)

    def unload(self, engine: Any, name: str) -> None:
        if name != self.name:
            raise ValueError(f"LoRA adapter {name!r} is not loaded (loaded: {self.name!r})")
        engine.update_weights_from_tensor(list(self.base.items()))
        self.name = None

    def check_requests(self, requests: Iterable[Any]) -> None:
        """Every request names the adapter being served (its `lora_name`; None = the base model)."""
        for r in requests:
            wanted = getattr(r, "lora_name", None)
            if wanted != self.name:
                raise ValueError(f"request {r.rid!r} asks for LoRA adapter {wanted!r} but this engine serves "
                                 f"{self.name!r} (one adapter at a time, merged into its weights)")


__all__ = ["MergedLoRA", "peft_modules", "PEFT_PREFIX"]
