"""Save and restore a trainer exactly: weights, optimizer moments, LR schedule, RNG and reference.

Layout: `<dir>/iter_<step>/rank_<global rank>.pt`, one file per rank holding that rank's shards, and
`<dir>/latest` naming the last complete iteration. A checkpoint becomes `latest` only after every rank
has written its file (barrier), so a run killed mid-save resumes from the previous one. Resuming needs
the same parallel layout (the optimizer state follows the distributed optimizer's buckets).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

from megatron_glue.trainer import MegatronTrainer

LATEST = "latest"


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _mark_unpadded(param_state: dict) -> dict:
    """megatron-core 0.16.1: `load_parameter_state_from_dp_reshardable` filters bucket entries on a
    'padding' key that `get_parameter_state_dp_reshardable` never writes (KeyError). Entries written
    by the getter are all real parameters, so mark them unpadded."""
    for gbuf_idx, by_dtype in param_state.items():
        if not isinstance(gbuf_idx, int):
            continue
        for buckets in by_dtype.values():
            for bucket in buckets:
                for entry in bucket:
                    entry.setdefault("padding", False)
    return param_state


def _unshare_adam_steps(optimizer: Any) -> None:
    """megatron-core 0.16.1, without Apex/TE (the CPU path): `DistributedOptimizer.load_state_dict`
    assigns ONE step tensor to every parameter's state; torch's Adam then increments it once per
    parameter per step, corrupting bias correction after a resume. Give each parameter its own copy."""
    for opt in _sub_optimizers(optimizer):
        inner = getattr(opt, "optimizer", None)
        for state in (inner.state.values() if inner is not None else []):
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(trainer: MegatronTrainer, directory: str | Path, extra: Optional[dict] = None) -> Path:
    """Write this rank's state for `trainer.step`; rank 0 marks it latest once all ranks are done."""
    directory = Path(directory)
    it_dir = directory / f"iter_{trainer.step:07d}"
    it_dir.mkdir(parents=True, exist_ok=True)
    subs = _sub_optimizers(trainer.optimizer)
    payload = {
        "step": trainer.step,
        "model": trainer.raw_state_dict(),  # with LoRA: base and adapters apart, as the optimizer state refers to
        "optimizer": trainer.optimizer.state_dict(),
        "param_state": [
            opt.get_parameter_state_dp_reshardable() if hasattr(opt, "get_parameter_state_dp_reshardable") else None
            for opt in subs
        ],
        "scheduler": trainer.scheduler.state_dict(),
        "rng": _rng_state(),
        "reference": trainer._reference,
        "extra": extra or {},
    }
    path = it_dir / f"rank_{_rank():05d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    _barrier()
    if _rank() == 0:
        marker = directory / (LATEST + ".tmp")
        marker.write_text(it_dir.name + "\n")
        os.replace(marker, directory / LATEST)
    _barrier()
    return it_dir


def latest_checkpoint(directory: str | Path) -> Optional[Path]:
    marker = Path(directory) / LATEST
    if not marker.is_file():
        return None
    it_dir = Path(directory) / marker.read_text().strip()
    return it_dir if it_dir.is_dir() else None


def load_checkpoint(trainer: MegatronTrainer, directory: str | Path) -> dict:
    """Restore the latest checkpoint under `directory` into `trainer`; returns its `extra` dict."""
    it_dir = latest_checkpoint(directory)
    if it_dir is None:
        raise FileNotFoundError(f"{directory}: no complete checkpoint (missing or stale '{LATEST}' marker)")
    path = it_dir / f"rank_{_rank():05d}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: this rank's checkpoint file is missing (was the parallel layout changed?)")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    trainer.load_raw_state_dict(payload["model"])
    trainer.optimizer.load_state_dict(payload["optimizer"])
    _unshare_adam_steps(trainer.optimizer)
    for opt, state in zip(_sub_optimizers(trainer.optimizer), payload["param_state"]):
        if state is None:
            continue
        with torch.no_grad():
            # A fresh optimizer has no Adam moments yet; create them so they are restored too
            # (megatron-core's own loader does the same before loading parameter state).
            if not opt.optimizer.state:
                opt._init_optimizer_states_with_dummy_values()
            opt.load_parameter_state_from_dp_reshardable(_mark_unpadded(state))
    trainer.scheduler.load_state_dict(payload["scheduler"])
    trainer.step = payload["step"]
    trainer._reference = payload["reference"]
    _set_rng_state(payload["rng"])
    return payload["extra"]
