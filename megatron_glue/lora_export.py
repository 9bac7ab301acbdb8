"""The trained LoRA adapters in PEFT's layout: `adapter_model.safetensors` + `adapter_config.json`, HF module names.

Megatron fuses what HF keeps apart (q/k/v in one `linear_qkv`, gate and up in one `linear_fc1`), so one Megatron
adapter becomes several PEFT ones: they share the fused layer's input and so its A; B is gathered over TP like
the fused weight's rows and cut into the HF modules' rows by the same rules as the weight
(`weight_names`: q/k/v grouped per query group, fc1 = [gate; up]). PEFT then computes, per HF module,
W x + (lora_alpha / r) B_part A x, which is the Megatron adapter's output on those rows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu

from megatron_glue.sharding import rank_parameters, tp_join
from megatron_glue.weight_export import _all_gather  # the TP gather the weight export does
from megatron_glue.weight_names import _split, model_dims, param_index

PEFT_PREFIX = "base_model.model."


def adapter_state(trainer: Any) -> dict[str, torch.Tensor]:
    """This pipeline stage's adapters under PEFT names (whole tensors, on the host). Collective over TP: every
    TP rank calls it."""
    adapters, sizes = trainer.adapters, trainer.sizes
    d = model_dims(trainer.hf_config)
    index = param_index(d)
    out: dict[str, torch.Tensor] = {}
    tp_group = mpu.get_tensor_model_parallel_group()
    params = rank_parameters(trainer.hf_config, mpu.get_expert_model_parallel_rank(), sizes.ep,
                             mpu.get_pipeline_model_parallel_rank(), sizes.pp)
    for param in params:
        prefix = param.local_name.removesuffix(".weight")
        adapter = adapters.get(prefix)
        if adapter is None or not param.local_name.endswith(".weight"):
            continue
        a, b = adapter.lora_a.detach().float(), adapter.lora_b.detach().float()
        # an expert's adapter is whole on its rank (expert-TP 1, lora.py) and its global name names its expert
        if not adapter.is_expert and adapter.kind == "column":  # B split like the weight's rows
            b = tp_join(param.full_name, _all_gather(b, tp_group, sizes.tp), trainer.hf_config)
        elif not adapter.is_expert:  # A split like the weight's columns
            a = tp_join(param.full_name, _all_gather(a, tp_group, sizes.tp), trainer.hf_config)
        p = index[param.full_name]
        for hf_name, b_part in zip(p.hf, _split(p, b, dataclasses.replace(d, hidden=adapter.rank))):
            module = PEFT_PREFIX + hf_name.removesuffix(".weight")
            out[f"{module}.lora_A.weight"] = a.cpu().clone()
            out[f"{module}.lora_B.weight"] = b_part.cpu().contiguous().clone()
    return out


HF_MODULES = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
              "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",),
              "experts": ("gate_proj", "up_proj", "down_proj")}  # per expert: mlp.experts.{e}.gate_proj ...


def gathered_adapter(trainer: Any) -> Optional[dict[str, torch.Tensor]]:
    """Every stage's adapters under PEFT names on global rank 0 (None elsewhere). Collective: every rank calls it
    (TP gathers, then one all-gather: each stage's dense adapters from its first TP and data-parallel rank, each
    EP rank's expert adapters from its first expert-TP and expert-data-parallel rank)."""
    state = adapter_state(trainer)
    dense_sender = mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_data_parallel_rank() == 0
    expert_sender = mpu.get_expert_tensor_parallel_rank() == 0 and mpu.get_expert_data_parallel_rank() == 0
    mine = {k: v for k, v in state.items() if (expert_sender if ".mlp.experts." in k else dense_sender)}
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    else:
        parts = [mine]
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return {k: v for part in parts for k, v in part.items()}


def peft_config(spec: Any, tensors: dict[str, torch.Tensor], base_model: str = "") -> dict[str, Any]:
    """PEFT's adapter_config.json for `tensors` (its target_modules are the HF modules they adapt)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
            "lora_dropout": spec.dropout, "target_modules": sorted({k.split(".")[-3] for k in tensors}),
            "bias": "none", "fan_in_fan_out": False, "base_model_name_or_path": base_model, "inference_mode": True}


def write_peft_adapter(trainer: Any, directory: str | Path, base_model: str = "") -> Path:
    """Every rank calls it; global rank 0 writes `directory/adapter_model.safetensors` and `adapter_config.json`."""
    from safetensors.torch import save_file

    merged = gathered_adapter(trainer)
    root = Path(directory)
    if merged is not None:
        root.mkdir(parents=True, exist_ok=True)
        save_file(merged, str(root / "adapter_model.safetensors"))
        config = peft_config(trainer.settings.lora, merged, base_model)
        (root / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return root


__all__ = ["adapter_state", "gathered_adapter", "peft_config", "write_peft_adapter", "PEFT_PREFIX", "HF_MODULES"]
