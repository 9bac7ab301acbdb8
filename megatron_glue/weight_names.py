"""HF Qwen3 / Qwen3-MoE weight names <-> full Megatron-core GPTModel weight names: the layout model and the mapping.

Two weight layouts appear here:

* **Canonical HF** (what checkpoints on disk, `save_pretrained` and SGLang's weight-update API use):
  `model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, ...; MoE experts
  are stored PER EXPERT: `model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight` of shapes
  (I, H), (I, H), (H, I). transformers 5.23 holds the experts FUSED in memory
  (`mlp.experts.gate_up_proj` (E, 2I, H), gate rows first, then up; `mlp.experts.down_proj`
  (E, H, I)), but its `save_pretrained` writes the per-expert names above (its conversion mapping
  "qwen2_moe" is applied in reverse on save) and `from_pretrained` reads them back (checked: a saved
  tiny Qwen3-MoE lists `model.layers.0.mlp.experts.0.gate_proj.weight` ... and reloads bit-exact).
  `canonical_hf_state_dict` accepts either form and returns per-expert names;
  `to_transformers_state_dict` returns the fused form an in-memory model's `load_state_dict` needs.
  With `tie_word_embeddings` the canonical form has no `lm_head.weight` (an `lm_head.weight` in the
  input must equal the embedding and is then dropped, else ValueError).

* **Full Megatron** (unsharded, GLOBAL layer and expert indices): the names of a TP=PP=EP=1 model
  built by `model_provider.build_gpt_model` with the local layer spec, e.g.
  `decoder.layers.{i}.self_attention.linear_qkv.weight` (rows grouped per query group:
  [q of the group's heads, k, v] for group 0, then group 1, ...), `decoder.layers.{i}.mlp.linear_fc1`
  = cat([gate, up]) (dense), `decoder.layers.{i}.mlp.experts.local_experts.{j}.linear_fc1.weight`
  with j the GLOBAL expert index, `output_layer.weight` (absent when tied). No `_extra_state` keys.

`megatron_params(model_dims(hf_config))` lists every full Megatron tensor with the canonical HF tensors
it is made of; `megatron_glue.sharding` cuts the full state into rank shards from the same list.

Every conversion returns a `LazyStateDict` (a read-only Mapping whose values are computed from the
source on each access; `dict(x)` materialises it), and sources may be any Mapping (one with a
`shape_of(name)` method answers shapes without reading data). Key sets and every tensor's shape are
checked against the config up front; a missing, extra or mis-shaped tensor raises ValueError naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from megatron_glue.model_provider import hf_is_moe, hf_num_experts

EXTRA_STATE = "._extra_state"

__all__ = [
    "EXTRA_STATE",
    "LazyStateDict",
    "ModelDims",
    "MegatronParam",
    "model_dims",
    "megatron_params",
    "param_index",
    "check_keys_and_shapes",
    "is_extra_state",
    "tensor_shape",
    "natural_key",
    "canonical_hf_state_dict",
    "to_transformers_state_dict",
    "hf_to_megatron",
    "megatron_to_hf",
    "megatron_param_to_hf",
]


# --------------------------------------------------------------------------------------------------
# Lazy mappings and small helpers


class LazyStateDict(Mapping):
    """Read-only, ordered Mapping name -> tensor; each access calls `getter(name)` (no caching).

    `shape_of(name)` answers without computing the tensor.
    """

    def __init__(self, keys: Sequence[str], getter: Callable[[str], torch.Tensor], shapes: Mapping[str, tuple]):
        self._keys = list(keys)
        self._key_set = set(self._keys)
        self._getter = getter
        self._shapes = shapes

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._key_set:
            raise KeyError(key)
        return self._getter(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._key_set

    def shape_of(self, key: str) -> tuple:
        if key not in self._key_set:
            raise KeyError(key)
        return tuple(self._shapes[key])

    def materialize(self) -> dict[str, torch.Tensor]:
        return {k: self[k] for k in self._keys}


def tensor_shape(src: Mapping, key: str) -> tuple:
    """The shape of `src[key]`, from `src.shape_of(key)` when the Mapping has one (no tensor read)."""
    fn = getattr(src, "shape_of", None)
    if fn is not None:
        return tuple(fn(key))
    return tuple(src[key].shape)


def natural_key(name: str) -> list:
    """Sort key that orders the numbers inside names numerically (`layers.2` before `layers.10`)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _fmt_names(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names, key=natural_key)
    head = ", ".join(names[:limit])
    return head + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# --------------------------------------------------------------------------------------------------
# The model's parameters, from its config


@dataclass(frozen=True)
class ModelDims:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense intermediate size (unused for MoE)
    experts: int
    moe_ffn: int
    tied: bool

    @property
    def moe(self) -> bool:
        return self.experts > 0


def model_dims(hf_config: Any) -> ModelDims:
    """The sizes of an HF Qwen3 / Qwen3-MoE config; ValueError for variants the mapping does not support."""
    if getattr(hf_config, "attention_bias", False):
        raise ValueError("Qwen3 configs with attention_bias=True are not supported (no linear biases)")
    moe = hf_is_moe(hf_config)
    if moe and getattr(hf_config, "mlp_only_layers", None):
        raise ValueError("Qwen3-MoE configs with dense mlp_only_layers are not supported")
    if moe and int(getattr(hf_config, "decoder_sparse_step", 1) or 1) != 1:
        raise ValueError("Qwen3-MoE configs with decoder_sparse_step != 1 are not supported")
    heads = int(hf_config.num_attention_heads)
    kv = int(hf_config.num_key_value_heads)
    if heads % kv:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return ModelDims(
        vocab=int(hf_config.vocab_size),
        hidden=int(hf_config.hidden_size),
        layers=int(hf_config.num_hidden_layers),
        heads=heads,
        kv_heads=kv,
        head_dim=int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads),
        ffn=int(getattr(hf_config, "intermediate_size", 0) or 0),
        experts=hf_num_experts(hf_config) if moe else 0,
        moe_ffn=int(getattr(hf_config, "moe_intermediate_size", 0) or 0) if moe else 0,
        tied=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


@dataclass(frozen=True)
class MegatronParam:
    """One Megatron tensor and the canonical HF tensors it is made of.

    template: Megatron name with `{layer}` / `{expert}` placeholders; kind: how HF tensors combine
    ('copy', 'qkv', 'fc1'); split: the TP rule ('vocab', 'qkv', 'col', 'gated', 'rep').
    """

    template: str
    hf: tuple[str, ...]
    kind: str
    split: str
    shape: tuple
    layer: Optional[int] = None
    expert: Optional[int] = None

    def name(self, layer: Optional[int] = None, expert: Optional[int] = None) -> str:
        return self.template.format(
            layer=self.layer if layer is None else layer, expert=self.expert if expert is None else expert
        )

    @property
    def full_name(self) -> str:
        return self.name()

    @property
    def linear(self) -> bool:
        """A Megatron parallel linear (has `_extra_state`)."""
        return self.split in ("qkv", "col", "gated") or self.template.startswith("output_layer")


def megatron_params(d: ModelDims) -> list[MegatronParam]:
    """Every full Megatron tensor of the model, in state-dict order, with its HF sources and TP rule."""
    H, hd = d.hidden, d.head_dim
    out = [MegatronParam("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "copy", "vocab", (d.vocab, H))]
    for i in range(d.layers):
        hp = f"model.layers.{i}."
        mp = "decoder.layers.{layer}."
        out += [
            MegatronParam(mp + "input_layernorm.weight", (hp + "input_layernorm.weight",), "copy", "rep", (H,), i),
            MegatronParam(
                mp + "self_attention.linear_qkv.weight",
                tuple(hp + f"self_attn.{x}_proj.weight" for x in "qkv"),
                "qkv",
                "qkv",
                ((d.heads + 2 * d.kv_heads) * hd, H),
                i,
            ),
            MegatronParam(
                mp + "self_attention.linear_proj.weight", (hp + "self_attn.o_proj.weight",), "copy", "col", (H, d.heads * hd), i
            ),
            MegatronParam(mp + "self_attention.q_layernorm.weight", (hp + "self_attn.q_norm.weight",), "copy", "rep", (hd,), i),
            MegatronParam(mp + "self_attention.k_layernorm.weight", (hp + "self_attn.k_norm.weight",), "copy", "rep", (hd,), i),
            MegatronParam(mp + "pre_mlp_layernorm.weight", (hp + "post_attention_layernorm.weight",), "copy", "rep", (H,), i),
        ]
        if d.moe:
            out.append(MegatronParam(mp + "mlp.router.weight", (hp + "mlp.gate.weight",), "copy", "rep", (d.experts, H), i))
            for j in range(d.experts):
                ep = mp + "mlp.experts.local_experts.{expert}."
                he = hp + f"mlp.experts.{j}."
                I = d.moe_ffn
                out += [
                    MegatronParam(
                        ep + "linear_fc1.weight", (he + "gate_proj.weight", he + "up_proj.weight"), "fc1", "gated", (2 * I, H), i, j
                    ),
                    MegatronParam(ep + "linear_fc2.weight", (he + "down_proj.weight",), "copy", "col", (H, I), i, j),
                ]
        else:
            I = d.ffn
            out += [
                MegatronParam(
                    mp + "mlp.linear_fc1.weight", (hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"), "fc1", "gated", (2 * I, H), i
                ),
                MegatronParam(mp + "mlp.linear_fc2.weight", (hp + "mlp.down_proj.weight",), "copy", "col", (H, I), i),
            ]
    out.append(MegatronParam("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", "rep", (H,)))
    if not d.tied:
        out.append(MegatronParam("output_layer.weight", ("lm_head.weight",), "copy", "vocab", (d.vocab, H)))
    return out


def _hf_shapes(d: ModelDims) -> dict[str, tuple]:
    H, hd, I, Im = d.hidden, d.head_dim, d.ffn, d.moe_ffn
    shapes: dict[str, tuple] = {"model.embed_tokens.weight": (d.vocab, H)}
    for i in range(d.layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (d.heads * hd, H),
                p + "self_attn.k_proj.weight": (d.kv_heads * hd, H),
                p + "self_attn.v_proj.weight": (d.kv_heads * hd, H),
                p + "self_attn.o_proj.weight": (H, d.heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "post_attention_layernorm.weight": (H,),
            }
        )
        if d.moe:
            shapes[p + "mlp.gate.weight"] = (d.experts, H)
            for j in range(d.experts):
                e = p + f"mlp.experts.{j}."
                shapes.update({e + "gate_proj.weight": (Im, H), e + "up_proj.weight": (Im, H), e + "down_proj.weight": (H, Im)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)})
    shapes["model.norm.weight"] = (H,)
    if not d.tied:
        shapes["lm_head.weight"] = (d.vocab, H)
    return shapes


def check_keys_and_shapes(src: Mapping, expected: Mapping[str, tuple], what: str, ignore: Callable[[str], bool] = lambda k: False) -> None:
    """ValueError, prefixed with `what`, naming the missing, unexpected (keys where `ignore` is false) and
    mis-shaped tensors of `src` against `expected` (name -> shape)."""
    present = {k for k in src.keys() if not ignore(k)}
    missing = [k for k in expected if k not in present]
    extra = [k for k in present if k not in expected]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_fmt_names(missing)}")
    if extra:
        problems.append(f"unexpected {len(extra)} tensor(s) (not part of this config): {_fmt_names(extra)}")
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
    bad = []
    for k, shp in expected.items():
        got = tensor_shape(src, k)
        if tuple(got) != tuple(shp):
            bad.append(f"{k}: shape {tuple(got)}, config expects {tuple(shp)}")
    if bad:
        raise ValueError(f"{what}: wrong shape for {len(bad)} tensor(s): " + "; ".join(bad[:8]))


# --------------------------------------------------------------------------------------------------
# HF <-> canonical HF <-> transformers in-memory


_FUSED_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def canonical_hf_state_dict(sd: Mapping[str, torch.Tensor], hf_config: Any) -> LazyStateDict:
    """Per-expert canonical HF names from per-expert or fused (transformers 5 in-memory) names.

    Checks that the key set and every shape match the config. `lm_head.weight` with tied embeddings
    is accepted only when equal to the embedding (it is then dropped, since it is not a weight of its own).
    """
    d = model_dims(hf_config)
    expected = _hf_shapes(d)
    E, Im, H = d.experts, d.moe_ffn, d.hidden
    getters: dict[str, Callable[[], torch.Tensor]] = {}
    given_shapes: dict[str, tuple] = {}
    fused_seen: set[str] = set()
    for k in sd.keys():
        m = _FUSED_RE.match(k)
        if m and d.moe:
            fused_seen.add(k)
            i, which = int(m.group(1)), m.group(2)
            shp = tensor_shape(sd, k)
            want = (E, 2 * Im, H) if which == "gate_up_proj" else (E, H, Im)
            if tuple(shp) != want:
                raise ValueError(f"HF state dict: wrong shape for {k}: shape {tuple(shp)}, config expects {want}")
            for j in range(E):
                e = f"model.layers.{i}.mlp.experts.{j}."
                if which == "gate_up_proj":
                    getters[e + "gate_proj.weight"] = lambda k=k, j=j: sd[k][j, :Im]
                    getters[e + "up_proj.weight"] = lambda k=k, j=j: sd[k][j, Im:]
                    given_shapes[e + "gate_proj.weight"] = given_shapes[e + "up_proj.weight"] = (Im, H)
                else:
                    getters[e + "down_proj.weight"] = lambda k=k, j=j: sd[k][j]
                    given_shapes[e + "down_proj.weight"] = (H, Im)
            continue
        if k == "lm_head.weight" and d.tied:
            emb = "model.embed_tokens.weight"
            if emb in sd:
                a, b = sd[k], sd[emb]
                if a.shape != b.shape or not (a.data_ptr() == b.data_ptr() or torch.equal(a, b)):
                    raise ValueError(
                        "HF state dict: tie_word_embeddings=True but lm_head.weight differs from model.embed_tokens.weight"
                    )
            continue
        if k in getters:
            raise ValueError(f"HF state dict: {k} given both per expert and fused")
        getters[k] = lambda k=k: sd[k]

    class _View(Mapping):
        def __getitem__(self, key):
            return getters[key]()

        def __iter__(self):
            return iter(getters)

        def __len__(self):
            return len(getters)

        def shape_of(self, key):
            return given_shapes[key] if key in given_shapes else tensor_shape(sd, key)

    view = _View()
    check_keys_and_shapes(view, expected, "HF state dict")
    return LazyStateDict(list(expected), lambda k: getters[k](), expected)


def to_transformers_state_dict(sd: Mapping[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """The state dict an in-memory transformers 5 model loads with `load_state_dict(strict=True)`:
    fused experts, and `lm_head.weight` (the embedding) when tied."""
    d = model_dims(hf_config)
    can = canonical_hf_state_dict(sd, hf_config)
    out: dict[str, torch.Tensor] = {}
    expert_re = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.\d+\.")
    for k in can:
        m = expert_re.match(k)
        if m:
            continue
        out[k] = can[k]
    if d.moe:
        for i in range(d.layers):
            p = f"model.layers.{i}.mlp.experts."
            out[p + "gate_up_proj"] = torch.stack(
                [torch.cat([can[p + f"{j}.gate_proj.weight"], can[p + f"{j}.up_proj.weight"]], 0) for j in range(d.experts)]
            )
            out[p + "down_proj"] = torch.stack([can[p + f"{j}.down_proj.weight"] for j in range(d.experts)])
    if d.tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# --------------------------------------------------------------------------------------------------
# canonical HF <-> full Megatron


def _combine(p: MegatronParam, parts: Sequence[torch.Tensor], d: ModelDims) -> torch.Tensor:
    if p.kind == "copy":
        return parts[0]
    if p.kind == "fc1":
        return torch.cat(list(parts), 0)
    if p.kind == "qkv":
        q, k, v = parts
        H, hd, g = d.hidden, d.head_dim, d.heads // d.kv_heads
        return torch.cat(
            [q.reshape(d.kv_heads, g * hd, H), k.reshape(d.kv_heads, hd, H), v.reshape(d.kv_heads, hd, H)], 1
        ).reshape(-1, H)
    raise AssertionError(p.kind)


def _split(p: MegatronParam, t: torch.Tensor, d: ModelDims) -> list[torch.Tensor]:
    if p.kind == "copy":
        return [t]
    if p.kind == "fc1":
        return list(t.chunk(2, 0))
    if p.kind == "qkv":
        H, hd, g = d.hidden, d.head_dim, d.heads // d.kv_heads
        q, k, v = t.reshape(d.kv_heads, (g + 2) * hd, H).split([g * hd, hd, hd], 1)
        return [q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)]
    raise AssertionError(p.kind)


def hf_to_megatron(hf_sd: Mapping[str, torch.Tensor], hf_config: Any) -> LazyStateDict:
    """Canonical (or fused) HF -> full Megatron names (global layer / expert indices), lazily."""
    d = model_dims(hf_config)
    src = canonical_hf_state_dict(hf_sd, hf_config)
    params = {p.full_name: p for p in megatron_params(d)}

    def get(name: str) -> torch.Tensor:
        p = params[name]
        return _combine(p, [src[h] for h in p.hf], d)

    return LazyStateDict(list(params), get, {n: p.shape for n, p in params.items()})


def is_extra_state(k: str) -> bool:
    """Whether a Megatron state-dict key is a parallel linear's `_extra_state` entry."""
    return k.endswith(EXTRA_STATE)


def megatron_to_hf(full_sd: Mapping[str, torch.Tensor], hf_config: Any) -> LazyStateDict:
    """Full Megatron (global indices) -> canonical per-expert HF names, lazily. `_extra_state` keys are ignored."""
    d = model_dims(hf_config)
    params = megatron_params(d)
    check_keys_and_shapes(full_sd, {p.full_name: p.shape for p in params}, "Megatron state dict", is_extra_state)
    where: dict[str, tuple[MegatronParam, int]] = {}
    for p in params:
        for idx, h in enumerate(p.hf):
            where[h] = (p, idx)
    shapes = _hf_shapes(d)

    def get(name: str) -> torch.Tensor:
        p, idx = where[name]
        return _split(p, full_sd[p.full_name], d)[idx]

    return LazyStateDict(list(shapes), get, shapes)


def megatron_param_to_hf(name: str, tensor: torch.Tensor, hf_config: Any) -> list[tuple[str, torch.Tensor]]:
    """One full Megatron tensor (global name) -> its canonical HF (name, tensor) pairs (e.g. for
    streaming weight updates to an inference engine). Unknown names raise ValueError."""
    d = model_dims(hf_config)
    p = param_index(d).get(name)
    if p is None:
        raise ValueError(f"{name!r} is not a Megatron parameter of this config (expects global layer/expert indices)")
    if tuple(tensor.shape) != tuple(p.shape):
        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, config expects {tuple(p.shape)}")
    return list(zip(p.hf, _split(p, tensor, d)))


_PARAM_CACHE: dict[ModelDims, dict[str, MegatronParam]] = {}


def param_index(d: ModelDims) -> dict[str, MegatronParam]:
    """Full Megatron name -> `MegatronParam` (cached per model dims)."""
    idx = _PARAM_CACHE.get(d)
    if idx is None:
        idx = _PARAM_CACHE[d] = {p.full_name: p for p in megatron_params(d)}
    return idx
