"""Collectives get tensors where their backend can move them; bf16 models keep bf16 norms (found on an H100)."""

from __future__ import annotations

import torch
from megatron.core import parallel_state as mpu

from megatron_glue import parallel
from megatron_glue.model_provider import build_gpt_model, transformer_config_from_hf
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config


def test_gloo_collectives_use_the_cpu_and_nccl_ones_the_current_cuda_device(monkeypatch):
    single_process_parallel_state(0)
    group = mpu.get_data_parallel_group()
    assert parallel.collective_device(group) == torch.device("cpu")
    monkeypatch.setattr(parallel.dist, "get_backend", lambda g=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert parallel.collective_device(group) == torch.device("cuda", 3)


def test_a_bf16_model_has_bf16_norm_weights():
    single_process_parallel_state(0)
    hf = tiny_moe_config()
    model = build_gpt_model(hf, transformer_config_from_hf(hf, params_dtype=torch.bfloat16), use_te=False)
    norms = {n: p.dtype for n, p in model.named_parameters() if "layernorm" in n or n.startswith("decoder.final")}
    assert any("q_layernorm" in n for n in norms) and any("input_layernorm" in n for n in norms)
    assert set(norms.values()) == {torch.bfloat16}, norms
