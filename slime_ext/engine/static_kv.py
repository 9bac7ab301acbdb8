"""A lean Qwen3 / Qwen3-MoE forward over a preallocated KV cache: the embedded engine's fast path.

Why: on a small model the HF forward is bound by per-call overhead (mask building, cache objects,
module dispatch), not arithmetic; SGLang likewise runs its own model code rather than transformers'.
This forward reads the HF model's own parameters (no copies, so in-place weight updates apply at once)
and computes the same function with fewer operations:
- every row's KV sits left-aligned in one preallocated tensor per layer [rows, kv_heads, capacity, dim];
  a row's tokens are written at its own length, so no padding holes, no per-step mask concatenation;
- linear layers and experts run on packed real tokens only (prefill pads nothing but attention);
- experts are one grouped matmul over tokens sorted by expert (a loop where torch lacks grouped_mm);
- finished rows are dropped lazily: their slots keep computing until a quarter of the batch is dead,
  then the cache is compacted once (a copy per finished row would cost more than the wasted rows).
Anything the forward does not model (another architecture, sliding windows) makes `supports` false and the
engine keeps the HF path; tests hold the two to the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from slime_ext.algo.grouped_matmul import grouped_linear, grouped_mm_runs
from slime_ext.engine.prefix_cache import KV, PrefixCache

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")
COMPACT_DEAD_FRACTION = 0.25  # compact the cache once this share of its rows has finished
CAPACITY_SLACK = 64  # extra slots per row at prefill; the cache doubles when a row reaches the end
PREFILL_ATTENTION_ELEMENTS = 1 << 24  # rows are prefilled in chunks so rows x queries x keys stays under this


def unsupported_reason(model: torch.nn.Module) -> Optional[str]:
    """Why `StaticKVState` cannot run `model` (None when it can)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    for layer in model.model.layers:
        mlp = layer.mlp
        if hasattr(mlp, "experts") and not hasattr(mlp.experts, "gate_up_proj"):
            return f"experts of type {type(mlp.experts).__name__} (fused gate_up_proj expected)"
    return None


def supports(model: torch.nn.Module) -> bool:
    return unsupported_reason(model) is None


@dataclass
class _Layer:
    """References to one decoder layer's parameters (read at every generate call, never copied)."""

    ln_attn: torch.Tensor
    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    o: torch.nn.Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    ln_mlp: torch.Tensor
    mlp: torch.nn.Module
    moe: bool


def _layers(model: torch.nn.Module) -> list[_Layer]:
    out = []
    for layer in model.model.layers:
        attn = layer.self_attn
        out.append(_Layer(layer.input_layernorm.weight, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                          attn.q_norm.weight, attn.k_norm.weight, layer.post_attention_layernorm.weight,
                          layer.mlp, hasattr(layer.mlp, "experts")))
    return out


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3 RMSNorm: normalise in fp32, cast back, then scale."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)  # no module call: hooks and dispatch cost per call


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of `x` sorted by expert times each expert's weight [E, out, in]: y[i] = x[i] @ W[e(i)].T.
    `counts` per expert and their int32 cumulative `offsets`; the loop reads counts on the host only when needed."""
    if grouped_mm_runs(x, weight):
        return grouped_linear(x, weight, offsets)
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            out[start:start + c] = F.linear(x[start:start + c], weight[e])
            start += c
    return out


class QwenStaticForward:
    """The forward pass itself: packed tokens in, per-token hidden states out, KV written in place."""

    def __init__(self, model: torch.nn.Module):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the static-KV forward cannot run this model: {reason}")
        self.model = model
        cfg = model.config
        self.eps = float(cfg.rms_norm_eps)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.groups = self.heads // self.kv_heads
        self.layers = _layers(model)
        self.top_k = int(getattr(cfg, "num_experts_per_tok", 0) or 0)
        self.norm_topk = bool(getattr(cfg, "norm_topk_prob", True))
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device

    def new_cache(self, rows: int, capacity: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.layers]

    def __call__(self, cache: list[tuple[torch.Tensor, torch.Tensor]], ids: torch.Tensor, rows: torch.Tensor,
                 slots: torch.Tensor, width: int, record: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Run packed tokens `ids` [N] of cache rows `rows` [N] at positions `slots` [N] (a row's tokens are
        consecutive, in order). `width` = max new tokens of a row (1 when decoding). Returns the final
        normed hidden states [N, hidden] and, with `record`, the routed expert ids [N, moe_layers, top_k]."""
        inner = self.model.model
        h = F.embedding(ids, inner.embed_tokens.weight)
        cos, sin = inner.rotary_emb(h, slots[None])
        cos, sin = cos[0][:, None], sin[0][:, None]
        attend = self._attention_plan(cache[0][0].shape[0], rows, slots, width)
        routing = []
        for li, layer in enumerate(self.layers):
            x = _rms(h, layer.ln_attn, self.eps)
            h = h + self._attention(layer, cache[li], x, rows, slots, cos, sin, attend)
            x = _rms(h, layer.ln_mlp, self.eps)
            if layer.moe:
                y, chosen = self._moe(layer.mlp, x)
                if record:
                    routing.append(chosen)
            else:
                mlp = layer.mlp
                y = F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight),
                             mlp.down_proj.weight)
            h = h + y
        h = _rms(h, inner.norm.weight, self.eps)
        return h, (torch.stack(routing, dim=1).to(torch.int16) if record else None)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias).float()

    def _attention_plan(self, n_rows: int, rows: torch.Tensor, slots: torch.Tensor, width: int) -> dict:
        """Index and mask tensors shared by every layer of one call."""
        keys = int(slots.max()) + 1
        if width == 1 and rows.shape[0] == n_rows:  # decode: one query per row, rows in order
            mask = torch.arange(keys, device=slots.device)[None] <= slots[:, None]
            return {"keys": keys, "mask": mask[:, None, None], "column": None}
        column = torch.arange(rows.shape[0], device=rows.device)
        starts = torch.ones_like(rows, dtype=torch.bool)
        starts[1:] = rows[1:] != rows[:-1]
        first = torch.cummax(torch.where(starts, column, torch.zeros_like(column)), 0).values
        column = column - first  # index of a token among its row's new tokens
        first_slot = torch.zeros(n_rows, dtype=slots.dtype, device=slots.device)
        first_slot[rows[starts]] = slots[starts]  # each row's first new token (one write per row)
        query_slot = first_slot[:, None] + torch.arange(width, device=slots.device)[None]  # [rows, width]
        mask = torch.arange(keys, device=slots.device)[None, None] <= query_slot[:, :, None]  # [rows, width, keys]
        mask = mask[:, None, None].expand(n_rows, 1, self.groups, width, keys).reshape(n_rows, 1, self.groups * width, keys)
        return {"keys": keys, "mask": mask, "column": column, "width": width}

    def _attention(self, layer: _Layer, kv: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, rows: torch.Tensor,
                   slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: dict) -> torch.Tensor:
        n = x.shape[0]
        q = _rms(_linear(layer.q, x).view(n, self.heads, self.head_dim), layer.q_norm, self.eps)
        k = _rms(_linear(layer.k, x).view(n, self.kv_heads, self.head_dim), layer.k_norm, self.eps)
        v = _linear(layer.v, x).view(n, self.kv_heads, self.head_dim)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys, values = kv
        keys[rows, :, slots] = k
        values[rows, :, slots] = v
        span = plan["keys"]
        k_all, v_all = keys[:, :, :span], values[:, :, :span]
        if plan["column"] is None:  # decode: the query heads of one kv head are its "queries"
            out = F.scaled_dot_product_attention(q.view(n, self.kv_heads, self.groups, self.head_dim), k_all, v_all,
                                                 attn_mask=plan["mask"])
            return _linear(layer.o, out.reshape(n, self.heads * self.head_dim))
        width, column = plan["width"], plan["column"]
        padded = q.new_zeros(keys.shape[0], width, self.heads, self.head_dim)
        padded[rows, column] = q
        padded = padded.view(-1, width, self.kv_heads, self.groups, self.head_dim).permute(0, 2, 3, 1, 4)
        padded = padded.reshape(-1, self.kv_heads, self.groups * width, self.head_dim)
        out = F.scaled_dot_product_attention(padded, k_all, v_all, attn_mask=plan["mask"])
        out = out.view(-1, self.kv_heads, self.groups, width, self.head_dim).permute(0, 3, 1, 2, 4)
        out = out.reshape(-1, width, self.heads * self.head_dim)[rows, column]
        return _linear(layer.o, out)

    def _moe(self, block: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k routing as transformers' Qwen3MoeTopKRouter, then each expert on the tokens routed to it."""
        router, experts = block.gate, block.experts
        probs = torch.softmax(F.linear(x, router.weight), dim=-1, dtype=torch.float)
        weight, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        weight = weight.to(x.dtype)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=experts.gate_up_proj.shape[0])
        offsets = counts.cumsum(0).to(torch.int32)
        token = order // self.top_k
        gate_up = _grouped_linear(x[token], experts.gate_up_proj, counts, offsets)
        gate, up = gate_up.chunk(2, dim=-1)
        y = _grouped_linear(F.silu(gate) * up, experts.down_proj, counts, offsets)
        y = y * weight.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token, y), chosen


class StaticKVState:
    """One model's batch during a generate call on the static-KV forward (the `_ModelState` interface).

    Logical rows (what the engine sees) map to physical cache rows; `select` only remaps until enough rows
    are dead (COMPACT_DEAD_FRACTION) or a row is duplicated, then copies. `lengths[p]` = tokens fed to
    physical row p."""

    def __init__(self, model: torch.nn.Module, store: PrefixCache, record: bool = False):
        self.forward = QwenStaticForward(model)
        self.store = store
        self.record = record
        self.recorder = True if record else None  # the engine tests `recorder is not None`
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.physical = torch.zeros(0, dtype=torch.long)  # logical row -> physical row
        self.prefill_routing: list[torch.Tensor] = []
        self.step_routing: Optional[torch.Tensor] = None
        self.compactions = 0

    def prefix_length(self, ids: list[int], max_len: int) -> int:
        return self.store.prefix_length(ids, max_len, with_routing=self.record)

    @torch.no_grad()
    def prefill(self, inputs: list[list[int]], limits: Optional[list[int]] = None) -> tuple[torch.Tensor, list[int]]:
        """Prefill unique inputs (reusing cached prefixes, at most `limits[i]` tokens of input i). Returns
        last-position logits [U, V] and the cached tokens used per input."""
        caps = limits if limits is not None else [len(ids) - 1 for ids in inputs]
        routed: list[Optional[torch.Tensor]] = [None] * len(inputs)
        if self.record:
            found = [self.store.longest_prefix_routed(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
            prefixes = [(p, kv) for p, kv, _ in found]
            routed = [r for _, _, r in found]
        else:
            prefixes = [self.store.longest_prefix(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
        n = len(inputs)
        capacity = max(len(ids) for ids in inputs) + CAPACITY_SLACK
        fwd = self.forward
        self.cache = fwd.new_cache(n, capacity)
        for i, (p, kv) in enumerate(prefixes):
            if p:
                for (keys, values), (k, v) in zip(self.cache, kv):
                    keys[i, :, :p] = k
                    values[i, :, :p] = v
        self.lengths = torch.tensor([len(ids) for ids in inputs], dtype=torch.long)
        self.physical = torch.arange(n)
        hidden_last = [None] * n
        new_routing: list[Optional[torch.Tensor]] = [None] * n
        for chunk in self._prefill_chunks(inputs, prefixes):
            ids, rows, slots, width = [], [], [], 1
            for i in chunk:
                p = prefixes[i][0]
                rest = inputs[i][p:]
                ids.extend(rest)
                rows.extend([i - chunk.start] * len(rest))
                slots.extend(range(p, len(inputs[i])))
                width = max(width, len(rest))
            rows_t = torch.tensor(rows, dtype=torch.long, device=fwd.device)
            view = [(k[chunk.start:chunk.stop], v[chunk.start:chunk.stop]) for k, v in self.cache]
            hidden, routing = fwd(view, torch.tensor(ids, dtype=torch.long, device=fwd.device), rows_t,
                                  torch.tensor(slots, dtype=torch.long, device=fwd.device), width, self.record)
            at = 0
            for i in chunk:
                r = len(inputs[i]) - prefixes[i][0]
                hidden_last[i] = hidden[at + r - 1]
                if routing is not None:
                    new_routing[i] = routing[at:at + r].cpu()
                at += r
        logits = fwd.logits(torch.stack(hidden_last))
        self.prefill_routing = []
        if self.record:
            for i, (p, _) in enumerate(prefixes):
                parts = ([routed[i]] if p else []) + [new_routing[i]]
                self.prefill_routing.append(torch.cat(parts) if len(parts) > 1 else parts[0].clone())
        for i, ids in enumerate(inputs):
            self.store.insert(ids, self.row_kv(i), self.prefill_routing[i] if self.record else None)
        return logits, [p for p, _ in prefixes]

    def _prefill_chunks(self, inputs: list[list[int]], prefixes: list) -> list[range]:
        """Contiguous row ranges whose padded attention (rows x query heads x new tokens x keys) stays under
        PREFILL_ATTENTION_ELEMENTS, so one long batch never builds a huge mask or score tensor."""
        chunks, start, width, keys = [], 0, 0, 0
        for i, ids in enumerate(inputs):
            w, k = max(width, len(ids) - prefixes[i][0]), max(keys, len(ids))
            if i > start and (i + 1 - start) * self.forward.heads * w * k > PREFILL_ATTENTION_ELEMENTS:
                chunks.append(range(start, i))
                start, w, k = i, len(ids) - prefixes[i][0], len(ids)
            width, keys = w, k
        chunks.append(range(start, len(inputs)))
        return chunks

    def row_kv(self, row: int) -> KV:
        """Logical row's fed tokens' KV, per layer ([kv_heads, n, dim] each), copied (for the prefix cache)."""
        p = int(self.physical[row])
        n = int(self.lengths[p])
        return [(keys[p, :, :n].clone(), values[p, :, :n].clone()) for keys, values in self.cache]

    def fed(self, row: int) -> int:
        return int(self.lengths[int(self.physical[row])])

    def select(self, index: torch.Tensor) -> None:
        """Keep logical rows `index` (in that order; repeats duplicate a row)."""
        physical = self.physical[index]
        rows = self.cache[0][0].shape[0]
        duplicated = physical.unique().numel() < physical.numel()
        if duplicated or rows - physical.numel() >= max(1, int(COMPACT_DEAD_FRACTION * rows)):
            self.cache = [(k[physical], v[physical]) for k, v in self.cache]
            self.lengths = self.lengths[physical]
            physical = torch.arange(physical.numel())
            self.compactions += 1
        self.physical = physical

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per logical row; returns next-token logits [rows, V]."""
        fwd = self.forward
        rows = self.cache[0][0].shape[0]
        if int(self.lengths.max()) >= self.cache[0][0].shape[2]:
            self._grow()
        full = torch.zeros(rows, dtype=torch.long)
        full[self.physical] = tokens
        hidden, routing = fwd(self.cache, full.to(fwd.device), torch.arange(rows, device=fwd.device),
                              self.lengths.to(fwd.device), 1, self.record)
        self.lengths[self.physical] += 1
        index = self.physical.to(fwd.device)
        if routing is not None:
            self.step_routing = routing[index].cpu()
        return fwd.logits(hidden[index])

    def _grow(self) -> None:
        capacity = self.cache[0][0].shape[2]
        grown = []
        for keys, values in self.cache:
            k = keys.new_zeros(keys.shape[0], keys.shape[1], 2 * capacity, keys.shape[3])
            v = torch.zeros_like(k)
            k[:, :, :capacity] = keys
            v[:, :, :capacity] = values
            grown.append((k, v))
        self.cache = grown
