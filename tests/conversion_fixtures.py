"""Shared builders for the weight-conversion tests (test_weight_names, test_sharding, test_checkpoint_io,
test_convert): small Qwen3 / Qwen3-MoE configs, HF models with O(1)-scale weights, random full Megatron
states, every rank's shards, and the `mp` fixture.

Megatron's parallel state is process-global, so every test that builds a Megatron model uses the
module-scoped `mp` fixture (one process, TP = PP = EP = 1).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from megatron_glue import sharding as sh
from megatron_glue import weight_names as wn

torch.set_num_threads(1)

MOE_SMALL = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
    rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, max_position_embeddings=256,
)
DENSE_SMALL = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=48, rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, max_position_embeddings=256,
)


def moe_cfg(**kw):
    return Qwen3MoeConfig(**{**MOE_SMALL, **kw})


def dense_cfg(tied: bool, **kw):
    return Qwen3Config(**{**DENSE_SMALL, "tie_word_embeddings": tied, **kw})


def hf_model(cfg, seed: int = 0):
    """An HF model with O(1)-scale random weights; norm weights perturbed away from 1."""
    torch.manual_seed(seed)
    cls = Qwen3MoeForCausalLM if isinstance(cfg, Qwen3MoeConfig) else Qwen3ForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def tokens(cfg, seq: int = 12, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, cfg.vocab_size, (2, seq), generator=g)
    assert not torch.equal(t[0], t[1])
    return t


def canonical(model, cfg):
    return dict(wn.canonical_hf_state_dict(model.state_dict(), cfg))


@pytest.fixture(scope="module")
def mp():
    from megatron_glue.parallel import init_distributed, init_model_parallel, teardown
    from megatron_glue.model_provider import ParallelSizes

    init_distributed()
    init_model_parallel(ParallelSizes())
    yield
    teardown()


def build_megatron(cfg, pre_process=True, post_process=True):
    from megatron_glue.model_provider import ParallelSizes, build_gpt_model, transformer_config_from_hf

    tc = transformer_config_from_hf(cfg, ParallelSizes())
    return build_gpt_model(cfg, tc, pre_process=pre_process, post_process=post_process).eval()


def random_megatron_full(cfg, seed=3):
    g = torch.Generator().manual_seed(seed)
    ref = wn.hf_to_megatron(canonical(hf_model(cfg), cfg), cfg)
    return {k: torch.randn(ref.shape_of(k), generator=g) for k in ref}


def all_shards(full, cfg, tp, ep, pp):
    return {
        (t, e, p): sh.shard_megatron_state(full, cfg, t, tp, e, ep, p, pp)
        for t in range(tp) for e in range(ep) for p in range(pp)
    }
