"""The trainer's side of colocated sleep: its weights, gradients and optimizer state leave the device while the
engines generate on it, and come back before the train step.

Why: with `cluster.colocate` one GPU holds a trainer rank and an engine rank; SGLang's static pool alone takes
most of it (0.7 of 80 GiB at the reference layout) beside the trainer's ~30 GiB. Megatron-core 0.16 carries the
calls for this (the RL offload of its DDP buffers and optimizer): the parameter and gradient buffers are
emptied in place with `storage().resize_(0)` (every view into them, `param.main_grad` too, stays valid and
is refilled on return), the parameters copied to a host staging tensor first. The optimizer's state on the
device is moved to the host and back here, and only what this module moved: Megatron's own
`restore_from_cpu` sends every host tensor to CUDA, which would pull `optimizer_cpu_offload`'s host state onto
the GPU. On a machine without CUDA the same calls run (the staging copy is plain, not pinned, host memory),
so the order and the bytes are tested on CPU.

Frozen parameters (LoRA's base weights, `megatron_glue/lora.py`) are in no DDP buffer: DDP buffers only what
trains. They leave the device with the optimizer state, so a colocated LoRA rank frees what a full-training rank
frees and the plan's max(trainer, engine) holds for both.
"""

from __future__ import annotations

from typing import Any

import torch


def _device_of(trainer: Any) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _buffers(trainer: Any) -> list[Any]:
    ddp = trainer.model
    return list(getattr(ddp, "buffers", [])) + list(getattr(ddp, "expert_parallel_buffers", []))


def _optimizers(trainer: Any) -> list[Any]:
    opt = trainer.optimizer
    return list(getattr(opt, "chained_optimizers", None) or [opt])


class TrainerSleep:
    """`offload()` / `onload()` of one trainer rank; each returns the bytes it moved (0 when already there)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.asleep = False
        self._moved: list[tuple[dict, Any, torch.device]] = []  # (container, key, device) of optimizer state

    def offload(self) -> int:
        if self.asleep:
            return 0
        # the optimizer's tensors first, skipping views into the DDP buffers (fp32 training's main parameters
        # are the model's own), which the buffers' offload empties below
        in_buffers = {data.untyped_storage().data_ptr() for buffer in _buffers(self.trainer)
                      for data in (buffer.param_data, buffer.grad_data) if data is not None}
        moved = self._optimizer_state_to_host(in_buffers) + self._frozen_weights_to_host(in_buffers)
        for buffer in _buffers(self.trainer):
            for data in (buffer.param_data, buffer.grad_data):
                if data is not None:
                    moved += data.untyped_storage().nbytes()
            if buffer.param_data is not None and getattr(buffer, "param_data_cpu", None) is None \
                    and not torch.cuda.is_available():
                # Megatron stages into pinned memory, which needs CUDA: without it a plain host copy
                buffer.param_data_cpu = torch.empty_like(buffer.param_data, device="cpu")
            buffer.offload_to_cpu(move_params=True, move_grads=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.asleep = True
        return moved

    def onload(self) -> int:
        if not self.asleep:
            return 0
        moved = 0
        for buffer in _buffers(self.trainer):
            buffer.reload_from_cpu(move_params=True, move_grads=True)
            for data in (buffer.param_data, buffer.grad_data):
                if data is not None:
                    moved += data.untyped_storage().nbytes()
        for container, key, device in self._moved:
            value = container[key]
            moved += value.numel() * value.element_size()
            container[key] = value.to(device, non_blocking=True)
        self._moved = []
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.asleep = False
        return moved

    def _optimizer_state_to_host(self, in_buffers: set[int]) -> int:
        """Every optimizer state tensor on the trainer's device (Adam moments, fp32 main parameters) to the host,
        remembered so `onload` returns exactly these; tensors whose storage is a DDP buffer (`in_buffers`) stay."""
        device = _device_of(self.trainer)
        if device.type == "cpu":
            return 0  # already on the host: nothing leaves, nothing to bring back
        moved = 0
        for opt in _optimizers(self.trainer):
            inner = getattr(opt, "optimizer", None)
            if inner is None:
                continue
            for group in inner.param_groups:
                for p in group["params"]:
                    if isinstance(p, torch.Tensor) and p.device == device \
                            and p.untyped_storage().data_ptr() not in in_buffers:
                        moved += self._to_host(_ParamData(p), "data", device)
            for state in inner.state.values():
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor) and value.device == device \
                            and value.untyped_storage().data_ptr() not in in_buffers:
                        moved += self._to_host(state, key, device)
        return moved

    def _frozen_weights_to_host(self, in_buffers: set[int]) -> int:
        """The model's parameters outside the DDP buffers (`frozen_weights`) to the host, returned by `onload`."""
        device = _device_of(self.trainer)
        if device.type == "cpu":
            return 0
        return sum(self._to_host(_ParamData(p), "data", device)
                   for p in frozen_weights(self.trainer, in_buffers) if p.device == device)

    def _to_host(self, container: Any, key: Any, device: torch.device) -> int:
        """`container[key]` to the host, remembered so `onload` brings it back to `device`; its bytes."""
        value = container[key]
        container[key] = value.to("cpu")
        self._moved.append((container, key, device))
        return value.numel() * value.element_size()


def frozen_weights(trainer: Any, in_buffers: set[int]) -> list[torch.Tensor]:
    """Parameters whose storage no DDP buffer holds (`in_buffers`: the buffers' storage pointers): with LoRA the
    frozen base, in full training none."""
    return [p for p in trainer.model.module.parameters() if p.untyped_storage().data_ptr() not in in_buffers]


class _ParamData:
    """`container[key]` access to a parameter's `.data`, so moved parameters and state return the same way."""

    def __init__(self, param: torch.Tensor):
        self.param = param

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.param.data

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.param.data = value


__all__ = ["TrainerSleep", "frozen_weights"]
