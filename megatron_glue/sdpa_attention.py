"""Megatron-core's local core attention computed by torch's fused `scaled_dot_product_attention`.

Why: the local spec's `DotProductAttention` materialises [batch * heads, s, s] scores (baddbmm, a
masked_fill for the causal mask, softmax, bmm) and repeats keys/values for grouped-query attention; on the
CPU that is a quarter of a training step of the default model. Transformer Engine replaces it on GPUs;
without TE, torch's SDPA kernel (flash on CPU and CUDA) computes the same causal attention without the
score tensor. Cases the kernel does not model the same way (an explicit mask, dropout, a non-vanilla
softmax, query-key layer scaling) fall back to Megatron's own forward.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPADotProductAttention(DotProductAttention):
    def _fused(self, attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType]) -> bool:
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        dropout = self.config.attention_dropout if self.training else 0.0
        return (attention_mask is None and mask_type == AttnMaskType.causal and dropout == 0.0
                and self.softmax_offset is None and not self.config.apply_query_key_layer_scaling)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Optional[torch.Tensor] = None, packed_seq_params: Any = None) -> torch.Tensor:
        """query [sq, b, heads, dim], key/value [sk, b, groups, dim] -> context [sq, b, heads * dim]."""
        if attention_bias is not None or packed_seq_params is not None or not self._fused(attention_mask, attn_mask_type):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads or groups, s, dim]
        grouped = q.shape[1] != k.shape[1]
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=grouped)
        sq, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(sq, b, -1)
