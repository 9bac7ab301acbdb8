"""Model FLOPs of a Qwen3 / Qwen3-MoE config, counted the way the hardware limit is stated: matmul work only.

Why: a phase's efficiency is its achieved FLOP/s over the machine's matmul limit (benchmarks/roofline.py),
so the numerator must count the matmuls a forward really does: q/k/v/o projections, the router, the top-k
experts' gate/up/down (or the dense MLP), the LM head, and attention's two score/value products over the
context each token sees. Embedding lookups, norms, softmax and activations are not matmuls and are left out.
2 FLOPs per multiply-add; a training step is 3 forwards (forward + backward for activations and weights).
"""

from __future__ import annotations

from typing import Any


def _head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def matmul_params_per_token(cfg: Any) -> int:
    """Weights a token multiplies by in one forward (routed experts only, router included, no embeddings)."""
    h, hd = cfg.hidden_size, _head_dim(cfg)
    attention = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    experts = int(getattr(cfg, "num_experts", 0) or 0)
    if experts:
        mlp = cfg.num_experts_per_tok * 3 * h * cfg.moe_intermediate_size + experts * h
    else:
        mlp = 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * (attention + mlp) + cfg.vocab_size * h


def forward_flops_per_token(cfg: Any, context: float) -> float:
    """One token's forward: 2 x matmul params + attention (QK^T and PV: 2 x 2 x heads x head_dim x context
    per layer). `context` = keys the token attends to (s/2 on average for causal training on s tokens)."""
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * _head_dim(cfg) * context
    return 2 * matmul_params_per_token(cfg) + attention


def train_flops_per_token(cfg: Any, seq_len: float) -> float:
    """Forward + backward of causal training on sequences of `seq_len` tokens (mean context seq_len / 2)."""
    return 3 * forward_flops_per_token(cfg, seq_len / 2)
