"""The SDPA core attention computes what Megatron's local DotProductAttention computes (GQA, causal)."""

from __future__ import annotations

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from megatron_glue.model_provider import transformer_config_from_hf
from megatron_glue.sdpa_attention import SDPADotProductAttention
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config


@pytest.fixture(scope="module", autouse=True)
def _parallel():
    single_process_parallel_state(0)


def _pair():
    config = transformer_config_from_hf(tiny_moe_config())
    args = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return DotProductAttention(**args), SDPADotProductAttention(**args), config


def _inputs(config, seq=11, batch=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    heads, groups, dim = config.num_attention_heads, config.num_query_groups, config.kv_channels
    q = torch.randn(seq, batch, heads, dim, generator=gen, requires_grad=True)
    k = torch.randn(seq, batch, groups, dim, generator=gen, requires_grad=True)
    v = torch.randn(seq, batch, groups, dim, generator=gen, requires_grad=True)
    return q, k, v


def test_forward_and_backward_match_megatrons_attention():
    reference, fused, config = _pair()
    assert config.num_attention_heads != config.num_query_groups  # grouped-query attention is exercised
    outs, grads = [], []
    for module in (reference, fused):
        q, k, v = _inputs(config)
        out = module(q, k, v, attention_mask=None)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in (q, k, v)])
    assert outs[0].shape == outs[1].shape == (11, 3, config.num_attention_heads * config.kv_channels)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_causality_the_first_position_sees_only_itself():
    _, fused, config = _pair()
    q, k, v = _inputs(config, seq=5, batch=1)
    out = fused(q, k, v, attention_mask=None).detach().view(5, 1, config.num_attention_heads, config.kv_channels)
    group_of_head = torch.arange(config.num_attention_heads) // (config.num_attention_heads // config.num_query_groups)
    torch.testing.assert_close(out[0, 0], v.detach()[0, 0, group_of_head])  # softmax over one key is 1


def test_an_explicit_mask_falls_back_to_megatrons_forward():
    reference, fused, config = _pair()
    q, k, v = _inputs(config, seq=6, batch=2)
    mask = torch.zeros(2, 1, 6, 6, dtype=torch.bool)
    mask[:, :, :, 3:] = True  # hide keys 3.. (True = masked, Megatron's convention)
    expected = reference(q, k, v, attention_mask=mask)
    got = fused(q, k, v, attention_mask=mask)
    torch.testing.assert_close(got, expected)
    assert not fused._fused(mask, None) and fused._fused(None, None)
