"""Tensor-, expert- and pipeline-parallel sharding of full Megatron-core GPTModel states.

The full (unsharded, global-index) layout and its parameter list come from `megatron_glue.weight_names`.

**Rank shards**: what the model of one (tp_rank, ep_rank, pp_rank) loads with
`load_state_dict(strict=True)`: local layer numbers (from 0 on each stage), local expert numbers,
TP slices, and `<linear>._extra_state = None` entries for every parallel linear (the local spec's
linears define extra state; strict loading needs the keys). Sharding rules (megatron-core 0.16,
expert tensor-parallel size == TP size, so a rank's expert-TP rank is its TP rank):
vocab-parallel embedding / output layer split on dim 0; linear_qkv split on dim 0 in contiguous
chunks (valid since rows are grouped per query group; needs num_key_value_heads % tp == 0);
linear_proj and linear_fc2 split on dim 1; gated linear_fc1 = cat(gate chunk r, up chunk r);
norms, q/k norms and the router replicated; EP rank r holds experts [r*E/ep, (r+1)*E/ep); PP stage
s holds layers [s*L/pp, (s+1)*L/pp). Embedding on the first stage, final norm and output layer on
the last; with tied embeddings and pp > 1 the last stage holds `output_layer.weight` too (a copy of
its embedding shard; Megatron keeps the two in sync through the embedding group). Virtual
pipeline stages and uneven pipeline splits are not supported. Shards use the local spec's names;
`load_into_model` adapts them to a Transformer Engine model (norms fused into the following
linear: `linear_qkv.layer_norm_weight`, dense `linear_fc1.layer_norm_weight`; its own extra
state), and `gather_megatron_states` accepts those names too.

Sharding a lazy full state (`weight_names.LazyStateDict`) reads only the tensors (and experts) the
rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from megatron_glue.weight_names import (
    EXTRA_STATE,
    LazyStateDict,
    MegatronParam,
    ModelDims,
    check_keys_and_shapes,
    is_extra_state,
    megatron_params,
    model_dims,
    param_index,
)

__all__ = [
    "check_parallel_sizes",
    "check_expert_tp_size",
    "RankParam",
    "rank_parameters",
    "expert_full_name",
    "tp_join",
    "own_storage",
    "shard_megatron_state",
    "gather_megatron_states",
    "load_into_model",
]


def check_parallel_sizes(hf_config: Any, tp_size: int, ep_size: int = 1, pp_size: int = 1) -> None:
    """ValueError naming the sizes when (tp, ep, pp) cannot shard this model."""
    d = model_dims(hf_config)
    errs = []
    if min(tp_size, ep_size, pp_size) < 1:
        errs.append(f"parallel sizes must be >= 1 (tp={tp_size}, ep={ep_size}, pp={pp_size})")
    else:
        if d.kv_heads % tp_size:
            errs.append(f"num_key_value_heads {d.kv_heads} is not divisible by tp {tp_size}")
        if d.heads % tp_size:
            errs.append(f"num_attention_heads {d.heads} is not divisible by tp {tp_size}")
        if d.vocab % tp_size:
            errs.append(f"vocab_size {d.vocab} is not divisible by tp {tp_size}")
        if d.moe and d.moe_ffn % tp_size:
            errs.append(f"moe_intermediate_size {d.moe_ffn} is not divisible by tp {tp_size}")
        if not d.moe and d.ffn % tp_size:
            errs.append(f"intermediate_size {d.ffn} is not divisible by tp {tp_size}")
        if d.hidden % tp_size:
            errs.append(f"hidden_size {d.hidden} is not divisible by tp {tp_size}")
        if ep_size > 1 and not d.moe:
            errs.append(f"ep {ep_size} > 1 needs a MoE model (this config is dense)")
        if d.moe and d.experts % ep_size:
            errs.append(f"num_experts {d.experts} is not divisible by ep {ep_size}")
        if d.layers % pp_size:
            errs.append(f"num_hidden_layers {d.layers} is not divisible by pp {pp_size}")
    if errs:
        raise ValueError("incompatible parallel sizes: " + "; ".join(errs))


def _split_size(p: MegatronParam, tp: int, etp: int) -> int:
    """How many ways a parameter is TP-split: experts over the expert-TP size (1 or TP), the rest over TP."""
    return etp if p.expert is not None else tp


def check_expert_tp_size(tp_size: int, etp_size: Optional[int]) -> int:
    """The expert tensor-parallel size (None: the TP size); ValueError unless it is 1 or the TP size."""
    etp = tp_size if etp_size is None else int(etp_size)
    if etp not in (1, tp_size):
        raise ValueError(f"expert tensor-parallel size {etp} is not supported: use 1 (experts whole on every TP "
                         f"rank) or the TP size {tp_size}")
    return etp


def _tp_slice(p: MegatronParam, t: torch.Tensor, r: int, tp: int) -> torch.Tensor:
    if tp == 1 or p.split == "rep":
        return t
    if p.split in ("vocab", "qkv"):
        return t.chunk(tp, 0)[r]
    if p.split == "col":
        return t.chunk(tp, 1)[r]
    if p.split == "gated":
        gate, up = t.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]], 0)
    raise AssertionError(p.split)


def _tp_shape(p: MegatronParam, tp: int) -> tuple:
    s = list(p.shape)
    if p.split in ("vocab", "qkv", "gated"):
        s[0] //= tp
    elif p.split == "col":
        s[1] //= tp
    return tuple(s)


def _tp_join(p: MegatronParam, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1 or p.split == "rep":
        return parts[0]
    if p.split in ("vocab", "qkv"):
        return torch.cat(list(parts), 0)
    if p.split == "col":
        return torch.cat(list(parts), 1)
    if p.split == "gated":
        halves = [x.chunk(2, 0) for x in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    raise AssertionError(p.split)


@dataclass(frozen=True)
class _Placed:
    param: MegatronParam
    local_name: str
    pp_rank: int
    ep_rank: Optional[int]  # None: held by every EP rank


def _placement(d: ModelDims, ep_size: int, pp_size: int) -> list[_Placed]:
    """Where each full parameter lives, and its local name there."""
    per_stage = d.layers // pp_size
    per_ep = d.experts // ep_size if d.moe else 0
    out = []
    for p in megatron_params(d):
        if p.layer is None:
            stage = 0 if p.template.startswith("embedding") else pp_size - 1
            out.append(_Placed(p, p.template, stage, None))
            continue
        stage, local_layer = divmod(p.layer, per_stage)
        if p.expert is None:
            out.append(_Placed(p, p.name(layer=local_layer), stage, None))
        else:
            er, local_e = divmod(p.expert, per_ep)
            out.append(_Placed(p, p.name(layer=local_layer, expert=local_e), stage, er))
    return out


def _rank_layout(d: ModelDims, ep_rank: int, ep_size: int, pp_rank: int, pp_size: int) -> list[tuple[str, Optional[_Placed]]]:
    """The ordered (local name, placement) list of one rank; placement None marks `_extra_state`
    entries, and the tied last-stage `output_layer.weight` copy is a placement of the embedding."""
    out: list[tuple[str, Optional[_Placed]]] = []
    for pl in _placement(d, ep_size, pp_size):
        if pl.pp_rank != pp_rank or (pl.ep_rank is not None and pl.ep_rank != ep_rank):
            continue
        out.append((pl.local_name, pl))
        if pl.param.linear:
            out.append((pl.local_name[: -len(".weight")] + EXTRA_STATE, None))
    if d.tied and pp_rank == pp_size - 1:
        if pp_size > 1:
            emb_pl = _placement(d, ep_size, pp_size)[0]
            out.append(("output_layer.weight", _Placed(emb_pl.param, "output_layer.weight", pp_rank, None)))
        out.append(("output_layer._extra_state", None))
    return out


@dataclass(frozen=True)
class RankParam:
    """One parameter held by a rank: its local name, its full (global) name, whether it is
    TP-split, and (experts only) the local expert slot shared by every EP rank."""

    local_name: str
    full_name: str
    tp_split: bool
    expert_slot: Optional[int]


def rank_parameters(hf_config: Any, ep_rank: int, ep_size: int, pp_rank: int, pp_size: int) -> list[RankParam]:
    """The parameters of one (ep_rank, pp_rank) in a fixed order that is identical on every EP rank of a
    stage (expert i of each EP rank at the same position), so ranks can gather them in lockstep. The
    tied last-stage `output_layer.weight` copy is left out (its HF tensor is the embedding)."""
    d = model_dims(hf_config)
    per_ep = d.experts // ep_size if d.moe else 0
    out = []
    for local, pl in _rank_layout(d, ep_rank, ep_size, pp_rank, pp_size):
        if pl is None or (local == "output_layer.weight" and pl.param.template.startswith("embedding")):
            continue
        slot = None if pl.param.expert is None else pl.param.expert % per_ep
        out.append(RankParam(local, pl.param.full_name, pl.param.split != "rep", slot))
    return out


def expert_full_name(full_name: str, hf_config: Any, ep_rank: int, ep_size: int) -> str:
    """The global name of the same expert slot on another EP rank."""
    d = model_dims(hf_config)
    per_ep = d.experts // ep_size
    p = param_index(d)[full_name]
    return p.name(expert=ep_rank * per_ep + p.expert % per_ep)


def tp_join(full_name: str, parts: Sequence[torch.Tensor], hf_config: Any) -> torch.Tensor:
    """Rebuild a full tensor from its TP shards in TP-rank order (gated fc1 interleaves gate and up)."""
    return _tp_join(param_index(model_dims(hf_config))[full_name], parts)


def own_storage(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor owning exactly its storage (torch.save of a view writes the whole base)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0:
        return t
    return t.contiguous().clone()


def shard_megatron_state(
    full_sd: Mapping[str, torch.Tensor],
    hf_config: Any,
    tp_rank: int,
    tp_size: int,
    ep_rank: int = 0,
    ep_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    extra_state: bool = True,
    etp_size: Optional[int] = None,
) -> dict[str, Any]:
    """The state dict of rank (tp_rank, ep_rank, pp_rank) (see the module docstring for the rules).

    `full_sd` may be lazy (only this rank's tensors are read). Values own their storage (no views of
    the full tensors). `extra_state=False` leaves out the `<linear>._extra_state: None` entries.
    `etp_size` is the expert tensor-parallel size: None or `tp_size` splits experts like dense MLPs,
    1 keeps every expert whole on each TP rank (slime's Qwen3-30B-A3B layout: TP 4, EP 8, expert-TP 1).
    """
    check_parallel_sizes(hf_config, tp_size, ep_size, pp_size)
    etp = check_expert_tp_size(tp_size, etp_size)
    for name, r, n in (("tp", tp_rank, tp_size), ("ep", ep_rank, ep_size), ("pp", pp_rank, pp_size)):
        if not 0 <= r < n:
            raise ValueError(f"{name}_rank {r} out of range for {name}_size {n}")
    d = model_dims(hf_config)
    check_keys_and_shapes(full_sd, {p.full_name: p.shape for p in megatron_params(d)}, "Megatron state dict", is_extra_state)
    out: dict[str, Any] = {}
    for local, pl in _rank_layout(d, ep_rank, ep_size, pp_rank, pp_size):
        if pl is None:
            if extra_state:
                out[local] = None
            continue
        ways = _split_size(pl.param, tp_size, etp)
        out[local] = own_storage(_tp_slice(pl.param, full_sd[pl.param.full_name], tp_rank if ways > 1 else 0, ways))
    return out


def gather_megatron_states(
    shards: Mapping[tuple[int, int, int], Mapping[str, Any]],
    hf_config: Any,
    tp_size: int,
    ep_size: int = 1,
    pp_size: int = 1,
    etp_size: Optional[int] = None,
) -> LazyStateDict:
    """Inverse of `shard_megatron_state`: shards keyed (tp_rank, ep_rank, pp_rank) -> full Megatron
    state (lazy; each access concatenates the TP pieces). Shards may use Transformer Engine's fused-norm
    names (see `load_into_model`). Checks that every rank is present and that
    each shard's keys and shapes are those of its rank. Replicated tensors are read from TP rank 0 /
    EP rank 0; the tied last-stage `output_layer.weight` copy must equal the embedding shard."""
    check_parallel_sizes(hf_config, tp_size, ep_size, pp_size)
    etp = check_expert_tp_size(tp_size, etp_size)
    d = model_dims(hf_config)
    shards = {r: _from_te_names(sd) for r, sd in shards.items()}
    want = {(t, e, p) for t in range(tp_size) for e in range(ep_size) for p in range(pp_size)}
    have = set(shards)
    if want - have:
        raise ValueError(f"missing shards for (tp, ep, pp) ranks {sorted(want - have)}")
    if have - want:
        raise ValueError(f"shards for ranks {sorted(have - want)} do not exist with tp={tp_size}, ep={ep_size}, pp={pp_size}")
    layouts = {}
    for er in range(ep_size):
        for pr in range(pp_size):
            layouts[er, pr] = _rank_layout(d, er, ep_size, pr, pp_size)
            expected = {n: _tp_shape(pl.param, _split_size(pl.param, tp_size, etp))
                        for n, pl in layouts[er, pr] if pl is not None}
            for tr in range(tp_size):
                check_keys_and_shapes(shards[tr, er, pr], expected, f"shard (tp={tr}, ep={er}, pp={pr})", is_extra_state)
    if d.tied and pp_size > 1:
        last = pp_size - 1
        for tr in range(tp_size):
            for er in range(ep_size):
                a = shards[tr, er, last]["output_layer.weight"]
                b = shards[tr, er, 0]["embedding.word_embeddings.weight"]
                if not torch.equal(a, b):
                    raise ValueError(
                        f"tied embeddings: output_layer.weight of shard (tp={tr}, ep={er}, pp={last}) differs "
                        f"from embedding.word_embeddings.weight of shard (tp={tr}, ep={er}, pp=0)"
                    )
    placed = {pl.param.full_name: pl for pl in _placement(d, ep_size, pp_size)}

    def get(name: str) -> torch.Tensor:
        pl = placed[name]
        er = 0 if pl.ep_rank is None else pl.ep_rank
        ranks = [0] if pl.param.split == "rep" or _split_size(pl.param, tp_size, etp) == 1 else range(tp_size)
        return _tp_join(pl.param, [shards[tr, er, pl.pp_rank][pl.local_name] for tr in ranks])

    return LazyStateDict(list(placed), get, {n: pl.param.shape for n, pl in placed.items()})


_TE_FUSED_NORMS = (
    (".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
    (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),
)


def _from_te_names(shard: Mapping[str, Any]) -> Mapping[str, Any]:
    """Local-spec names for a shard that uses TE's fused-norm names (same values, no copies)."""
    if not any(k.endswith(new) for k in shard for _, new in _TE_FUSED_NORMS):
        return shard
    out = {}
    for k in shard:
        name = k
        for old, new in _TE_FUSED_NORMS:
            if k.endswith(new):
                name = k[: -len(new)] + old
        out[name] = shard[k]
    return out


def load_into_model(model: torch.nn.Module, shard: Mapping[str, Any]) -> None:
    """`model.load_state_dict(shard, strict=True)` after adapting a local-spec shard to the model:
    `_extra_state` entries the shard lacks are taken from the model, and with the Transformer Engine
    spec the norms fused into the following linear are renamed (`input_layernorm.weight` ->
    `self_attention.linear_qkv.layer_norm_weight`, dense `pre_mlp_layernorm.weight` ->
    `mlp.linear_fc1.layer_norm_weight`)."""
    own = model.state_dict()
    sd: dict[str, Any] = {}
    for k, v in shard.items():
        if k not in own:
            for old, new in _TE_FUSED_NORMS:
                if k.endswith(old) and k[: -len(old)] + new in own:
                    k = k[: -len(old)] + new
                    break
        if is_extra_state(k) and k not in own:
            continue
        sd[k] = v
    for k, v in own.items():
        if is_extra_state(k) and k not in sd:
            sd[k] = v
    model.load_state_dict(sd, strict=True)
