"""The grouped-matmul experts compute what megatron-core's SequentialMLP computes, forward and backward."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_glue.grouped_experts import GroupedSequentialMLP
from megatron_glue.model_provider import build_gpt_model, transformer_config_from_hf
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config


@pytest.fixture(scope="module", autouse=True)
def _parallel():
    single_process_parallel_state(0)


def _experts(config: TransformerConfig) -> GroupedSequentialMLP:
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False, qk_layernorm=True,
                                    normalization="RMSNorm").submodules.mlp.submodules.experts
    torch.manual_seed(0)
    experts = GroupedSequentialMLP(config.num_moe_experts, config, spec.submodules,
                                   pg_collection=get_default_pg_collection())
    for expert in experts.local_experts:  # default init is small; larger weights make differences visible
        for p in expert.parameters():
            torch.nn.init.normal_(p, std=0.5)
    return experts


def _run(experts: GroupedSequentialMLP, forward, tokens_per_expert: list[int], dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    rows = sum(tokens_per_expert)
    hidden = torch.randn(rows, experts.config.hidden_size, generator=gen, dtype=dtype, requires_grad=True)
    probs = torch.rand(rows, generator=gen, dtype=torch.float32)
    grad_out = torch.randn(rows, experts.config.hidden_size, generator=gen, dtype=dtype)
    experts.zero_grad(set_to_none=True)
    out, bias = forward(hidden, torch.tensor(tokens_per_expert), probs)
    assert bias is None
    out.backward(grad_out)
    grads = [p.grad.clone() for p in experts.parameters()]
    return out.detach(), hidden.grad.clone(), grads


def test_grouped_forward_and_backward_equal_the_sequential_loop():
    config = transformer_config_from_hf(tiny_moe_config())
    experts = _experts(config)
    counts = [3, 0, 6, 2]  # an expert with no tokens gets a zero gradient on both paths
    assert experts._grouped_applies(torch.zeros(1, config.hidden_size))
    grouped = _run(experts, experts.forward, counts)
    loop = _run(experts, lambda *a: SequentialMLP.forward(experts, *a), counts)
    torch.testing.assert_close(grouped[0], loop[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped[1], loop[1], atol=1e-5, rtol=1e-5)
    assert len(grouped[2]) == 2 * len(counts)
    for g, ref in zip(grouped[2], loop[2]):
        torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5)
    zero_expert = experts.local_experts[1]
    assert all(float(p.grad.abs().max()) == 0.0 for p in zero_expert.parameters())
    assert float(grouped[0].abs().mean()) > 0.1  # the comparison is not between zeros


def test_it_falls_back_to_the_loop_where_grouped_mm_cannot_run(monkeypatch):
    config = transformer_config_from_hf(tiny_moe_config())
    experts = _experts(config).double()
    assert not experts._grouped_applies(torch.zeros(1, config.hidden_size, dtype=torch.float64))
    calls = []
    monkeypatch.setattr("megatron_glue.grouped_experts.grouped_linear", lambda *a: calls.append(a))
    out, _, _ = _run(experts, experts.forward, [2, 2, 1, 0], dtype=torch.float64)
    loop, _, _ = _run(experts, lambda *a: SequentialMLP.forward(experts, *a), [2, 2, 1, 0], dtype=torch.float64)
    assert calls == [] and torch.equal(out, loop)
    odd = transformer_config_from_hf(tiny_moe_config(moe_intermediate_size=6))  # 24-byte rows: misaligned
    assert not _experts(odd)._grouped_applies(torch.zeros(1, odd.hidden_size))


def test_the_local_spec_builds_grouped_experts_with_sequential_mlp_parameter_names():
    hf = tiny_moe_config()
    model = build_gpt_model(hf, transformer_config_from_hf(hf), use_te=False)
    experts = [m for m in model.modules() if isinstance(m, SequentialMLP)]
    assert len(experts) == hf.num_hidden_layers and all(type(m) is GroupedSequentialMLP for m in experts)
    names = [n for n, _ in model.named_parameters() if ".experts." in n]
    assert "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight" in names
    assert len(names) == hf.num_hidden_layers * hf.num_experts * 2
