"""A lean Qwen3 / Qwen3-MoE forward over a preallocated KV cache: the embedded engine's fast path.

Why: on a small model the HF forward is bound by per-call overhead (mask building, cache objects,
module dispatch), not arithmetic; SGLang likewise runs its own model code rather than transformers'.
This forward reads the HF model's own parameters (no copies, so in-place weight updates apply at once)
and computes the same function with fewer operations:
- KV sits left-aligned in preallocated tensors per layer: each unique prompt's once ([prompts, kv_heads,
  longest prompt, dim]), and each row's generated tokens' in its own slots ([rows, kv_heads, capacity, dim]);
  the n samples of a prompt share its KV (decode attends to the prompt's keys with the queries of all its
  rows in one batched matmul, then to the row's own keys), so a group of n costs one prompt's KV, not n;
  a row's tokens are written at its own length, so no padding holes, no per-step mask concatenation;
- linear layers and experts run on packed real tokens only (prefill pads nothing but attention);
- experts are one grouped matmul over tokens sorted by expert (a loop where torch lacks grouped_mm);
- finished rows are dropped lazily: their slots keep computing until a quarter of the batch is dead,
  then the cache is compacted once (a copy per finished row would cost more than the wasted rows).
Anything the forward does not model (another architecture, sliding windows) makes `supports` false and the
engine keeps the HF path; tests hold the two to the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F

from slime_ext.algo.grouped_matmul import grouped_linear, grouped_mm_runs
from slime_ext.engine.prefix_cache import KV, PrefixCache

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")
COMPACT_DEAD_FRACTION = 0.25  # compact the cache once this share of its rows has finished
CAPACITY_SLACK = 64  # own (generated-token) slots per row at prefill; they double when a row reaches the end
PREFILL_ATTENTION_ELEMENTS = 1 << 24  # rows are prefilled in chunks so rows x queries x keys stays under this
KVPair = tuple[torch.Tensor, torch.Tensor]  # one layer's (keys, values), [rows, kv_heads, slots, head_dim] each


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
    """The forward pass itself: packed tokens in, per-token hidden states out; the attention object given to
    a call owns the KV layout (where the new tokens' KV is written and which KV each query reads)."""

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

    def new_cache(self, rows: int, capacity: int) -> list[KVPair]:
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.layers]

    def __call__(self, attention: "Attention", ids: torch.Tensor, positions: torch.Tensor,
                 record: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Run packed tokens `ids` [N] at rotary `positions` [N]; `attention` stores their KV and attends.
        Returns the final normed hidden states [N, hidden] and, with `record`, the routed expert ids
        [N, moe_layers, top_k]."""
        inner = self.model.model
        h = F.embedding(ids, inner.embed_tokens.weight)
        cos, sin = inner.rotary_emb(h, positions[None])
        cos, sin = cos[0][:, None], sin[0][:, None]
        routing = []
        for li, layer in enumerate(self.layers):
            x = _rms(h, layer.ln_attn, self.eps)
            h = h + self._attention(layer, li, attention, x, cos, sin)
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

    def _attention(self, layer: _Layer, li: int, attention: "Attention", x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q = _rms(_linear(layer.q, x).view(n, self.heads, self.head_dim), layer.q_norm, self.eps)
        k = _rms(_linear(layer.k, x).view(n, self.kv_heads, self.head_dim), layer.k_norm, self.eps)
        v = _linear(layer.v, x).view(n, self.kv_heads, self.head_dim)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = attention(li, q.view(n, self.kv_heads, self.groups, self.head_dim), k, v)
        return _linear(layer.o, out.reshape(n, self.heads * self.head_dim))

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


class Attention:
    """Where a forward call's new tokens' KV goes and what each query attends to (one object per call,
    shared by every layer): `attention(layer, q [N, kv_heads, groups, dim], k, v [N, kv_heads, dim])`
    stores k, v and returns the attention output [N, kv_heads, groups, dim]."""

    def __call__(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PackedAttention(Attention):
    """Prefill: the packed new tokens of the rows of one per-row cache (row r's tokens consecutive, at its
    `slots`), each attending to its row's earlier tokens and itself. `width` = most new tokens of a row."""

    def __init__(self, fwd: QwenStaticForward, cache: list[KVPair], rows: torch.Tensor, slots: torch.Tensor,
                 width: int):
        self.cache, self.rows, self.slots = cache, rows, slots
        self.kv_heads, self.groups, self.head_dim = fwd.kv_heads, fwd.groups, fwd.head_dim
        self.n_rows = cache[0][0].shape[0]
        self.keys = int(slots.max()) + 1
        self.width = width
        if width == 1 and rows.shape[0] == self.n_rows:  # one query per row, rows in order
            mask = torch.arange(self.keys, device=slots.device)[None] <= slots[:, None]
            self.mask, self.column = mask[:, None, None], None
        else:
            self.mask, self.column = self._padded_plan()

    def _padded_plan(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's index among its row's new tokens, and the mask of the rows' padded query blocks."""
        rows, slots, width = self.rows, self.slots, self.width
        column = torch.arange(rows.shape[0], device=rows.device)
        starts = torch.ones_like(rows, dtype=torch.bool)
        starts[1:] = rows[1:] != rows[:-1]
        first = torch.cummax(torch.where(starts, column, torch.zeros_like(column)), 0).values
        column = column - first
        first_slot = torch.zeros(self.n_rows, dtype=slots.dtype, device=slots.device)
        first_slot[rows[starts]] = slots[starts]  # each row's first new token (one write per row)
        query_slot = first_slot[:, None] + torch.arange(width, device=slots.device)[None]  # [rows, width]
        mask = torch.arange(self.keys, device=slots.device)[None, None] <= query_slot[:, :, None]
        mask = mask[:, None, None].expand(self.n_rows, 1, self.groups, width, self.keys)
        return mask.reshape(self.n_rows, 1, self.groups * width, self.keys), column

    def __call__(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = self.cache[li]
        keys[self.rows, :, self.slots] = k
        values[self.rows, :, self.slots] = v
        k_all, v_all = keys[:, :, :self.keys], values[:, :, :self.keys]
        if self.column is None:  # the query heads of one kv head are its "queries"
            return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=self.mask)
        kvh, g, d, width = self.kv_heads, self.groups, self.head_dim, self.width
        padded = q.new_zeros(self.n_rows, width, kvh, g, d)
        padded[self.rows, self.column] = q
        padded = padded.permute(0, 2, 3, 1, 4).reshape(self.n_rows, kvh, g * width, d)
        out = F.scaled_dot_product_attention(padded, k_all, v_all, attn_mask=self.mask)
        out = out.view(self.n_rows, kvh, g, width, d).permute(0, 3, 1, 2, 4)
        return out[self.rows, self.column]


class SharedPromptAttention(Attention):
    """Decode: one new token per row, attending to its prompt's KV, held once for all the rows that sample
    that prompt, and to the row's own generated tokens' KV.

    Why grouped: the prompt's keys are read once per prompt, not once per sample. The queries of the rows of
    one prompt are stacked (padded to the largest group) and multiplied by that prompt's keys in one batched
    matmul over prompts; the own keys are a per-row batched matmul; one softmax spans both parts."""

    def __init__(self, fwd: QwenStaticForward, prompts: list[KVPair], own: list[KVPair], layout: "SharedLayout"):
        dev = fwd.device
        self.prompts, self.own = prompts, own
        self.share, self.rank = layout.share.to(dev), layout.rank.to(dev)
        self.n_prompts, self.group, self.contiguous = layout.prompt_len.numel(), layout.group, layout.contiguous
        self.own_len = layout.own_len().to(dev)
        self.prompt_keys = int(layout.prompt_len.max())
        self.own_keys = int(layout.own_len().max()) + 1
        prompt_len = layout.prompt_len.to(dev)[self.share]
        prompt_mask = torch.arange(self.prompt_keys, device=dev)[None] < prompt_len[:, None]
        own_mask = torch.arange(self.own_keys, device=dev)[None] <= self.own_len[:, None]
        self.hidden = ~torch.cat([prompt_mask, own_mask], dim=1)[:, None, None]  # [rows, 1, 1, keys]: not attended
        self.scale = fwd.head_dim ** -0.5
        self.row_index = torch.arange(self.share.numel(), device=dev)

    def _by_prompt(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, kv_heads, groups, L] -> [prompts, kv_heads, group * groups, L]: each prompt's rows stacked
        (zero-padded to the largest group unless the rows already come in equal groups in prompt order)."""
        rows, kvh, g, length = x.shape
        if self.contiguous:
            padded = x.view(self.n_prompts, self.group, kvh, g, length)
        else:
            padded = x.new_zeros(self.n_prompts, self.group, kvh, g, length)
            padded[self.share, self.rank] = x
        return padded.transpose(1, 2).reshape(self.n_prompts, kvh, self.group * g, length)

    def _by_row(self, y: torch.Tensor, groups: int) -> torch.Tensor:
        """Inverse of `_by_prompt`: [prompts, kv_heads, group * groups, L] -> [rows, kv_heads, groups, L]."""
        kvh, length = y.shape[1], y.shape[-1]
        y = y.view(self.n_prompts, kvh, self.group, groups, length).transpose(1, 2)
        if self.contiguous:
            return y.reshape(-1, kvh, groups, length)
        return y[self.share, self.rank]

    def __call__(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        own_k, own_v = self.own[li]
        own_k[self.row_index, :, self.own_len] = k
        own_v[self.row_index, :, self.own_len] = v
        prompt_k, prompt_v = (t[:, :, :self.prompt_keys] for t in self.prompts[li])
        own_k, own_v = own_k[:, :, :self.own_keys], own_v[:, :, :self.own_keys]
        groups = q.shape[2]
        scores = torch.cat([self._by_row(self._by_prompt(q) @ prompt_k.transpose(-1, -2), groups),
                            q @ own_k.transpose(-1, -2)], dim=-1)
        scores = (scores.float() * self.scale).masked_fill(self.hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        from_prompt = self._by_row(self._by_prompt(probs[..., :self.prompt_keys]) @ prompt_v, groups)
        return from_prompt + probs[..., self.prompt_keys:] @ own_v


@dataclass
class SharedLayout:
    """The bookkeeping of prompt KV shared by rows: which prompt each physical row samples and how many
    tokens it has been fed. A row's own KV slot for its next token is `own_len()` (fed minus prompt)."""

    prompt_len: torch.Tensor  # [prompts] tokens of each prompt's KV
    share: torch.Tensor  # [rows] the prompt of each physical row
    lengths: torch.Tensor  # [rows] tokens fed to each physical row: its prompt's plus its own
    rank: torch.Tensor = field(init=False)  # [rows] a row's index among the rows of its prompt
    group: int = field(init=False)  # most rows of one prompt
    contiguous: bool = field(init=False)  # every prompt has `group` rows, in prompt order (no padding needed)

    def __post_init__(self) -> None:
        counts = torch.bincount(self.share, minlength=self.prompt_len.numel())
        order = torch.argsort(self.share, stable=True)
        first = counts.cumsum(0) - counts
        self.rank = torch.empty_like(self.share)
        self.rank[order] = torch.arange(self.share.numel()) - first[self.share[order]]
        self.group = int(counts.max()) if counts.numel() else 0
        self.contiguous = torch.equal(self.share, torch.arange(counts.numel()).repeat_interleave(self.group))

    def own_len(self) -> torch.Tensor:
        return self.lengths - self.prompt_len[self.share]


def _cat_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[rows, kv_heads, slots, dim] tensors stacked along rows, the one with fewer slots zero-padded."""
    slots = max(a.shape[2], b.shape[2])
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], slots, a.shape[3])
    out[:a.shape[0], :, :a.shape[2]] = a
    out[a.shape[0]:, :, :b.shape[2]] = b
    return out


class StaticKVState:
    """One model's batch during a generate call on the static-KV forward (the `_ModelState` interface).

    Each unique prompt's KV is held once (`prompts`, per layer [prompts, kv_heads, longest prompt, dim]);
    each physical row holds only the KV of the tokens fed after its prompt (`own`, per layer [rows, kv_heads,
    capacity, dim]) and the index of the prompt it samples, so n samples of a prompt cost one prompt's KV plus
    their own tokens' KV, not n copies of the prompt's. Logical rows (what the engine sees) map to physical
    rows; `select` only remaps until enough rows are dead (COMPACT_DEAD_FRACTION) or a row is duplicated,
    then copies the rows' own KV (and drops prompts no row samples any more)."""

    def __init__(self, model: torch.nn.Module, store: PrefixCache, record: bool = False):
        self.forward = QwenStaticForward(model)
        self.store = store
        self.record = record
        self.recorder = True if record else None  # the engine tests `recorder is not None`
        self.prompts: list[KVPair] = []
        self.own: list[KVPair] = []
        empty = torch.zeros(0, dtype=torch.long)
        self.layout = SharedLayout(empty, empty, empty)
        self.physical = empty  # logical row -> physical row
        self.prefill_routing: list[torch.Tensor] = []
        self.step_routing: Optional[torch.Tensor] = None
        self.compactions = 0

    def prefix_length(self, ids: list[int], max_len: int) -> int:
        return self.store.prefix_length(ids, max_len, with_routing=self.record)

    def kv_bytes(self) -> int:
        """Bytes of KV the batch holds (shared prompts and rows' own tokens)."""
        return sum(t.numel() * t.element_size() for pair in self.prompts + self.own for t in pair)

    @torch.no_grad()
    def prefill(self, inputs: list[list[int]], limits: Optional[list[int]] = None) -> tuple[torch.Tensor, list[int]]:
        """Prefill unique inputs (reusing cached prefixes, at most `limits[i]` tokens of input i) into the
        shared prompt KV, one physical row per input. Returns last-position logits [U, V] and the cached
        tokens used per input."""
        caps = limits if limits is not None else [len(ids) - 1 for ids in inputs]
        routed: list[Optional[torch.Tensor]] = [None] * len(inputs)
        if self.record:
            found = [self.store.longest_prefix_routed(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
            prefixes = [(p, kv) for p, kv, _ in found]
            routed = [r for _, _, r in found]
        else:
            prefixes = [self.store.longest_prefix(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
        n = len(inputs)
        fwd = self.forward
        self.prompts = fwd.new_cache(n, max(len(ids) for ids in inputs))
        for i, (p, kv) in enumerate(prefixes):
            if p:
                for (keys, values), (k, v) in zip(self.prompts, kv):
                    keys[i, :, :p] = k
                    values[i, :, :p] = v
        lengths = torch.tensor([len(ids) for ids in inputs], dtype=torch.long)
        self.layout = SharedLayout(lengths, torch.arange(n), lengths.clone())
        self.own = fwd.new_cache(n, CAPACITY_SLACK)
        self.physical = torch.arange(n)
        hidden_last, new_routing = self._prefill_rows(inputs, prefixes)
        logits = fwd.logits(torch.stack(hidden_last))
        self.prefill_routing = []
        if self.record:
            for i, (p, _) in enumerate(prefixes):
                parts = ([routed[i]] if p else []) + [new_routing[i]]
                self.prefill_routing.append(torch.cat(parts) if len(parts) > 1 else parts[0].clone())
        for i, ids in enumerate(inputs):
            self.store.insert_from(ids, partial(self.row_kv, i), self.prefill_routing[i] if self.record else None)
        return logits, [p for p, _ in prefixes]

    def _prefill_rows(self, inputs: list[list[int]],
                      prefixes: list) -> tuple[list[torch.Tensor], list[Optional[torch.Tensor]]]:
        """Feed every input's uncached tokens, chunk by chunk; each input's last hidden state and routing."""
        fwd = self.forward
        hidden_last: list[torch.Tensor] = [None] * len(inputs)
        new_routing: list[Optional[torch.Tensor]] = [None] * len(inputs)
        for chunk in self._prefill_chunks(inputs, prefixes):
            ids, rows, slots, width = [], [], [], 1
            for i in chunk:
                p = prefixes[i][0]
                rest = inputs[i][p:]
                ids.extend(rest)
                rows.extend([i - chunk.start] * len(rest))
                slots.extend(range(p, len(inputs[i])))
                width = max(width, len(rest))
            slots_t = torch.tensor(slots, dtype=torch.long, device=fwd.device)
            view = [(k[chunk.start:chunk.stop], v[chunk.start:chunk.stop]) for k, v in self.prompts]
            rows_t = torch.tensor(rows, dtype=torch.long, device=fwd.device)
            ids_t = torch.tensor(ids, dtype=torch.long, device=fwd.device)
            hidden, routing = fwd(PackedAttention(fwd, view, rows_t, slots_t, width), ids_t, slots_t, self.record)
            at = 0
            for i in chunk:
                r = len(inputs[i]) - prefixes[i][0]
                hidden_last[i] = hidden[at + r - 1]
                if routing is not None:
                    new_routing[i] = routing[at:at + r].cpu()
                at += r
        return hidden_last, new_routing

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

    def row_kv(self, row: int, start: int = 0) -> KV:
        """Logical row's fed tokens' KV from token `start` on (its prompt's, then its own), per layer
        ([kv_heads, n - start, dim] each), copied: the prefix cache keeps it, and asks only for the part
        past what it already holds (`PrefixCache.insert_from`), so a finished row costs its own tokens."""
        p = int(self.physical[row])
        u = int(self.layout.share[p])
        prompt, own = int(self.layout.prompt_len[u]), int(self.layout.own_len()[p])
        a, b = min(start, prompt), max(start - prompt, 0)
        return [(torch.cat([pk[u, :, a:prompt], ok[p, :, b:own]], dim=1),
                 torch.cat([pv[u, :, a:prompt], ov[p, :, b:own]], dim=1))
                for (pk, pv), (ok, ov) in zip(self.prompts, self.own)]

    def fed(self, row: int) -> int:
        return int(self.layout.lengths[int(self.physical[row])])

    def select(self, index: torch.Tensor) -> None:
        """Keep logical rows `index` (in that order; repeats duplicate a row: the copy shares its prompt KV
        and gets its own copy of the row's generated KV)."""
        physical = self.physical[index]
        rows = self.rows_in_use()
        duplicated = physical.unique().numel() < physical.numel()
        if duplicated or rows - physical.numel() >= max(1, int(COMPACT_DEAD_FRACTION * rows)):
            self._compact(physical)
            physical = torch.arange(physical.numel())
        self.physical = physical

    def _compact(self, physical: torch.Tensor) -> None:
        """Physical rows become `physical` (own KV copied); prompts no kept row samples are dropped."""
        self.own = [(k[physical], v[physical]) for k, v in self.own]
        layout = self.layout
        used, share = torch.unique(layout.share[physical], return_inverse=True)
        prompt_len = layout.prompt_len
        if used.numel() < prompt_len.numel():
            prompt_len = prompt_len[used]
            longest = int(prompt_len.max())
            self.prompts = [(k[used, :, :longest], v[used, :, :longest]) for k, v in self.prompts]
        self.layout = SharedLayout(prompt_len, share, layout.lengths[physical])
        self.compactions += 1

    def rows_in_use(self) -> int:
        """Physical rows the layout covers (the own-KV tensors may hold spare rows beyond them for merges)."""
        return self.layout.share.numel()

    def merge(self, other: "StaticKVState") -> None:
        """Append `other`'s logical rows after this batch's (continuous batching: requests that arrived while
        this batch ran, prefilled on their own). Their own KV goes into spare rows, reserved by doubling, so a
        merge copies the newcomers' KV, not the batch's; the prompts' KV (one per prompt) is concatenated."""
        used, joining = self.rows_in_use(), other.rows_in_use()
        capacity, slots = self.own[0][0].shape[0], self.own[0][0].shape[2]
        rows = capacity if used + joining <= capacity else max(used + joining, 2 * capacity)
        if rows > capacity or other.own[0][0].shape[2] > slots:
            self._reserve(rows, max(slots, other.own[0][0].shape[2]))
        for (k, v), (ok, ov) in zip(self.own, other.own):
            k[used:used + joining, :, :ok.shape[2]] = ok[:joining]
            v[used:used + joining, :, :ov.shape[2]] = ov[:joining]
        prompts = self.layout.prompt_len.numel()
        self.prompts = [(_cat_rows(k, ok), _cat_rows(v, ov)) for (k, v), (ok, ov) in zip(self.prompts, other.prompts)]
        theirs = other.layout
        self.layout = SharedLayout(torch.cat([self.layout.prompt_len, theirs.prompt_len]),
                                   torch.cat([self.layout.share, theirs.share + prompts]),
                                   torch.cat([self.layout.lengths, theirs.lengths]))
        self.physical = torch.cat([self.physical, other.physical + used])

    def _reserve(self, rows: int, slots: int) -> None:
        """Own-KV tensors of `rows` x `slots`, the rows in use copied over."""
        used, current = self.rows_in_use(), self.own[0][0].shape[2]
        grown = []
        for keys, values in self.own:
            k = keys.new_zeros(rows, keys.shape[1], slots, keys.shape[3])
            v = torch.zeros_like(k)
            k[:used, :, :current] = keys[:used]
            v[:used, :, :current] = values[:used]
            grown.append((k, v))
        self.own = grown

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per logical row; returns next-token logits [rows, V]."""
        fwd = self.forward
        layout = self.layout
        if int(layout.own_len().max()) >= self.own[0][0].shape[2]:
            self._grow()
        full = torch.zeros(layout.share.numel(), dtype=torch.long)
        full[self.physical] = tokens
        rows = self.rows_in_use()
        own = [(k[:rows], v[:rows]) for k, v in self.own]  # spare rows (reserved for merges) stay out
        attention = SharedPromptAttention(fwd, self.prompts, own, layout)
        hidden, routing = fwd(attention, full.to(fwd.device), layout.lengths.to(fwd.device), self.record)
        layout.lengths[self.physical] += 1
        index = self.physical.to(fwd.device)
        if routing is not None:
            self.step_routing = routing[index].cpu()
        return fwd.logits(hidden[index])

    def _grow(self) -> None:
        """Double every row's own-KV capacity (the prompts' KV never grows)."""
        self._reserve(self.own[0][0].shape[0], 2 * self.own[0][0].shape[2])
