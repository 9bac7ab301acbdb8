"""Weight conversion between HF Qwen3 / Qwen3-MoE checkpoints and Megatron-core GPTModel state dicts.

Three weight layouts appear here:

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

* **Rank shards**: what the model of one (tp_rank, ep_rank, pp_rank) loads with
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

Laziness: every conversion returns a `LazyStateDict` (a read-only Mapping whose values are computed
from the source on each access; `dict(x)` materialises it), and sources may be any Mapping, e.g.
`SafetensorsSource`, which reads one tensor from disk per access. Sharding a 30B checkpoint for one
rank therefore reads only the tensors (and experts) that rank holds. Key sets and every tensor's
shape are checked against the config up front (shapes from safetensors headers, without reading
data); a missing, extra or mis-shaped tensor raises ValueError naming it.

CLI:
    python -m megatron_glue.convert --to megatron --hf-dir IN --out OUT --tp 2 --ep 2 --pp 1
    python -m megatron_glue.convert --to hf --megatron-dir IN --out OUT
The Megatron directory holds one `torch.save` file per rank, `mp_rank_{tp:02d}_{ep:03d}_{pp:03d}.pt`,
and `megatron_meta.json` (format, sizes, HF config dict).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from megatron_glue.model_provider import hf_is_moe, hf_num_experts

META_FILE = "megatron_meta.json"
META_FORMAT = "megatron_glue.convert/v1"
SAFETENSORS_INDEX = "model.safetensors.index.json"
EXTRA_STATE = "._extra_state"

__all__ = [
    "LazyStateDict",
    "SafetensorsSource",
    "canonical_hf_state_dict",
    "to_transformers_state_dict",
    "hf_to_megatron",
    "megatron_to_hf",
    "megatron_param_to_hf",
    "check_parallel_sizes",
    "shard_megatron_state",
    "gather_megatron_states",
    "load_into_model",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
    "save_megatron_checkpoint",
    "load_megatron_checkpoint",
    "hf_config_from_dict",
    "main",
]


# --------------------------------------------------------------------------------------------------
# Lazy mappings


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


class SafetensorsSource(Mapping):
    """All tensors of the `*.safetensors` files of a directory (or an explicit file list), read lazily.

    Uses `model.safetensors.index.json` when present (every file it names must exist), else every
    `*.safetensors` file in the directory. A name found in two files is an error.
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike]):
        from safetensors import safe_open

        self._safe_open = safe_open
        if isinstance(path, (str, os.PathLike)):
            root = Path(path)
            index = root / SAFETENSORS_INDEX
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted({root / f for f in weight_map.values()})
                for f in files:
                    if not f.is_file():
                        raise FileNotFoundError(f"{index} names {f.name}, which does not exist")
            else:
                files = sorted(root.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in {root}")
        else:
            files = [Path(p) for p in path]
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for f in files:
            h = self._open(f)
            for k in h.keys():
                if k in self._where:
                    raise ValueError(f"tensor {k!r} appears in both {self._where[k]} and {f}")
                self._where[k] = f
        self._keys = sorted(self._where, key=_natural_key)

    def _open(self, f: Path) -> Any:
        h = self._handles.get(f)
        if h is None:
            h = self._handles[f] = self._safe_open(str(f), framework="pt", device="cpu")
        return h

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._open(self._where[key]).get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def shape_of(self, key: str) -> tuple:
        return tuple(self._open(self._where[key]).get_slice(key).get_shape())

    def file_of(self, key: str) -> Path:
        return self._where[key]


def _shape(src: Mapping, key: str) -> tuple:
    fn = getattr(src, "shape_of", None)
    if fn is not None:
        return tuple(fn(key))
    return tuple(src[key].shape)


def _natural_key(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _own(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor owning exactly its storage (torch.save of a view writes the whole base)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0:
        return t
    return t.contiguous().clone()


def _fmt_names(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names, key=_natural_key)
    head = ", ".join(names[:limit])
    return head + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# --------------------------------------------------------------------------------------------------
# The model's parameters, from its config


@dataclass(frozen=True)
class _Dims:
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


def _dims(hf_config: Any) -> _Dims:
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
    return _Dims(
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
class _Param:
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


def _params(d: _Dims) -> list[_Param]:
    H, hd = d.hidden, d.head_dim
    out = [_Param("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "copy", "vocab", (d.vocab, H))]
    for i in range(d.layers):
        hp = f"model.layers.{i}."
        mp = "decoder.layers.{layer}."
        out += [
            _Param(mp + "input_layernorm.weight", (hp + "input_layernorm.weight",), "copy", "rep", (H,), i),
            _Param(
                mp + "self_attention.linear_qkv.weight",
                tuple(hp + f"self_attn.{x}_proj.weight" for x in "qkv"),
                "qkv",
                "qkv",
                ((d.heads + 2 * d.kv_heads) * hd, H),
                i,
            ),
            _Param(mp + "self_attention.linear_proj.weight", (hp + "self_attn.o_proj.weight",), "copy", "col", (H, d.heads * hd), i),
            _Param(mp + "self_attention.q_layernorm.weight", (hp + "self_attn.q_norm.weight",), "copy", "rep", (hd,), i),
            _Param(mp + "self_attention.k_layernorm.weight", (hp + "self_attn.k_norm.weight",), "copy", "rep", (hd,), i),
            _Param(mp + "pre_mlp_layernorm.weight", (hp + "post_attention_layernorm.weight",), "copy", "rep", (H,), i),
        ]
        if d.moe:
            out.append(_Param(mp + "mlp.router.weight", (hp + "mlp.gate.weight",), "copy", "rep", (d.experts, H), i))
            for j in range(d.experts):
                ep = mp + "mlp.experts.local_experts.{expert}."
                he = hp + f"mlp.experts.{j}."
                I = d.moe_ffn
                out += [
                    _Param(ep + "linear_fc1.weight", (he + "gate_proj.weight", he + "up_proj.weight"), "fc1", "gated", (2 * I, H), i, j),
                    _Param(ep + "linear_fc2.weight", (he + "down_proj.weight",), "copy", "col", (H, I), i, j),
                ]
        else:
            I = d.ffn
            out += [
                _Param(mp + "mlp.linear_fc1.weight", (hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"), "fc1", "gated", (2 * I, H), i),
                _Param(mp + "mlp.linear_fc2.weight", (hp + "mlp.down_proj.weight",), "copy", "col", (H, I), i),
            ]
    out.append(_Param("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", "rep", (H,)))
    if not d.tied:
        out.append(_Param("output_layer.weight", ("lm_head.weight",), "copy", "vocab", (d.vocab, H)))
    return out


def _hf_shapes(d: _Dims) -> dict[str, tuple]:
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


def _check_keys_and_shapes(src: Mapping, expected: Mapping[str, tuple], what: str, ignore: Callable[[str], bool] = lambda k: False) -> None:
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
        got = _shape(src, k)
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
    d = _dims(hf_config)
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
            shp = _shape(sd, k)
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
            return given_shapes[key] if key in given_shapes else _shape(sd, key)

    view = _View()
    _check_keys_and_shapes(view, expected, "HF state dict")
    return LazyStateDict(list(expected), lambda k: getters[k](), expected)


def to_transformers_state_dict(sd: Mapping[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """The state dict an in-memory transformers 5 model loads with `load_state_dict(strict=True)`:
    fused experts, and `lm_head.weight` (the embedding) when tied."""
    d = _dims(hf_config)
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


def _combine(p: _Param, parts: Sequence[torch.Tensor], d: _Dims) -> torch.Tensor:
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


def _split(p: _Param, t: torch.Tensor, d: _Dims) -> list[torch.Tensor]:
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
    d = _dims(hf_config)
    src = canonical_hf_state_dict(hf_sd, hf_config)
    params = {p.full_name: p for p in _params(d)}

    def get(name: str) -> torch.Tensor:
        p = params[name]
        return _combine(p, [src[h] for h in p.hf], d)

    return LazyStateDict(list(params), get, {n: p.shape for n, p in params.items()})


def _is_extra(k: str) -> bool:
    return k.endswith(EXTRA_STATE)


def megatron_to_hf(full_sd: Mapping[str, torch.Tensor], hf_config: Any) -> LazyStateDict:
    """Full Megatron (global indices) -> canonical per-expert HF names, lazily. `_extra_state` keys are ignored."""
    d = _dims(hf_config)
    params = _params(d)
    _check_keys_and_shapes(full_sd, {p.full_name: p.shape for p in params}, "Megatron state dict", _is_extra)
    where: dict[str, tuple[_Param, int]] = {}
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
    d = _dims(hf_config)
    p = _param_index(d).get(name)
    if p is None:
        raise ValueError(f"{name!r} is not a Megatron parameter of this config (expects global layer/expert indices)")
    if tuple(tensor.shape) != tuple(p.shape):
        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, config expects {tuple(p.shape)}")
    return list(zip(p.hf, _split(p, tensor, d)))


_PARAM_CACHE: dict[_Dims, dict[str, _Param]] = {}


def _param_index(d: _Dims) -> dict[str, _Param]:
    idx = _PARAM_CACHE.get(d)
    if idx is None:
        idx = _PARAM_CACHE[d] = {p.full_name: p for p in _params(d)}
    return idx


# --------------------------------------------------------------------------------------------------
# Sharding


def check_parallel_sizes(hf_config: Any, tp_size: int, ep_size: int = 1, pp_size: int = 1) -> None:
    """ValueError naming the sizes when (tp, ep, pp) cannot shard this model."""
    d = _dims(hf_config)
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


def _split_size(p: _Param, tp: int, etp: int) -> int:
    """How many ways a parameter is TP-split: experts over the expert-TP size (1 or TP), the rest over TP."""
    return etp if p.expert is not None else tp


def _check_etp(tp_size: int, etp_size: Optional[int]) -> int:
    etp = tp_size if etp_size is None else int(etp_size)
    if etp not in (1, tp_size):
        raise ValueError(f"expert tensor-parallel size {etp} is not supported: use 1 (experts whole on every TP "
                         f"rank) or the TP size {tp_size}")
    return etp


def _tp_slice(p: _Param, t: torch.Tensor, r: int, tp: int) -> torch.Tensor:
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


def _tp_shape(p: _Param, tp: int) -> tuple:
    s = list(p.shape)
    if p.split in ("vocab", "qkv", "gated"):
        s[0] //= tp
    elif p.split == "col":
        s[1] //= tp
    return tuple(s)


def _tp_join(p: _Param, parts: Sequence[torch.Tensor]) -> torch.Tensor:
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
    param: _Param
    local_name: str
    pp_rank: int
    ep_rank: Optional[int]  # None: held by every EP rank


def _placement(d: _Dims, ep_size: int, pp_size: int) -> list[_Placed]:
    """Where each full parameter lives, and its local name there."""
    per_stage = d.layers // pp_size
    per_ep = d.experts // ep_size if d.moe else 0
    out = []
    for p in _params(d):
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


def _rank_layout(d: _Dims, ep_rank: int, ep_size: int, pp_rank: int, pp_size: int) -> list[tuple[str, Optional[_Placed]]]:
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
    d = _dims(hf_config)
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
    d = _dims(hf_config)
    per_ep = d.experts // ep_size
    p = _param_index(d)[full_name]
    return p.name(expert=ep_rank * per_ep + p.expert % per_ep)


def tp_join(full_name: str, parts: Sequence[torch.Tensor], hf_config: Any) -> torch.Tensor:
    """Rebuild a full tensor from its TP shards in TP-rank order (gated fc1 interleaves gate and up)."""
    return _tp_join(_param_index(_dims(hf_config))[full_name], parts)


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
    etp = _check_etp(tp_size, etp_size)
    for name, r, n in (("tp", tp_rank, tp_size), ("ep", ep_rank, ep_size), ("pp", pp_rank, pp_size)):
        if not 0 <= r < n:
            raise ValueError(f"{name}_rank {r} out of range for {name}_size {n}")
    d = _dims(hf_config)
    _check_keys_and_shapes(full_sd, {p.full_name: p.shape for p in _params(d)}, "Megatron state dict", _is_extra)
    out: dict[str, Any] = {}
    for local, pl in _rank_layout(d, ep_rank, ep_size, pp_rank, pp_size):
        if pl is None:
            if extra_state:
                out[local] = None
            continue
        ways = _split_size(pl.param, tp_size, etp)
        out[local] = _own(_tp_slice(pl.param, full_sd[pl.param.full_name], tp_rank if ways > 1 else 0, ways))
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
    etp = _check_etp(tp_size, etp_size)
    d = _dims(hf_config)
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
                _check_keys_and_shapes(shards[tr, er, pr], expected, f"shard (tp={tr}, ep={er}, pp={pr})", _is_extra)
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
        if _is_extra(k) and k not in own:
            continue
        sd[k] = v
    for k, v in own.items():
        if _is_extra(k) and k not in sd:
            sd[k] = v
    model.load_state_dict(sd, strict=True)


# --------------------------------------------------------------------------------------------------
# Checkpoint directories


def hf_config_from_dict(cfg: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    cfg = dict(cfg)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError("HF config dict has no model_type")
    return AutoConfig.for_model(model_type, **cfg)


def load_hf_checkpoint(path: str | os.PathLike) -> tuple[Any, SafetensorsSource]:
    """(HF config, lazy tensor Mapping) of an HF checkpoint directory (config.json + *.safetensors)."""
    from transformers import AutoConfig

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {root} does not exist")
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"HF checkpoint {root} has no config.json ({root / 'config.json'})")
    hf_config = AutoConfig.from_pretrained(str(root), local_files_only=True)
    return hf_config, SafetensorsSource(root)


def save_hf_checkpoint(
    path: str | os.PathLike,
    hf_config: Any,
    state_dict: Mapping[str, torch.Tensor],
    shard_size_mb: float = 4096,
    dtype: Optional[torch.dtype] = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[Path]:
    """Write canonical per-expert safetensors (+ index when more than one file) and config.json.

    Reads `state_dict` (canonical or fused names; may be lazy, even over the files being replaced)
    one output file at a time; files are written to a temporary sibling directory and then moved in,
    replacing earlier `*.safetensors` / index files of `path`. Tensors keep their dtype unless `dtype`
    is given; config.json's `dtype` is that of the embedding. Returns the written safetensors paths.
    """
    import shutil

    from safetensors.torch import save_file

    can = canonical_hf_state_dict(state_dict, hf_config)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    emb_dtype = dtype or can["model.embed_tokens.weight"].dtype
    limit = int(shard_size_mb * 2**20)
    itemsize = torch.empty((), dtype=emb_dtype).element_size()  # for grouping only
    groups: list[list[str]] = [[]]
    size = 0
    for k in can:
        n = 1
        for s in can.shape_of(k):
            n *= s
        b = n * itemsize
        if groups[-1] and size + b > limit:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += b
    names = (
        ["model.safetensors"]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        weight_map = {}
        total = 0
        for fname, keys in zip(names, groups):
            tensors = {}
            for k in keys:
                t = can[k]
                tensors[k] = _own(t if dtype is None else t.to(dtype))
                total += tensors[k].numel() * tensors[k].element_size()
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in keys})
            log(f"wrote {root / fname} ({len(keys)} tensors)")
            del tensors
        if len(groups) > 1:
            (tmp / SAFETENSORS_INDEX).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
            )
        cfg = copy.deepcopy(hf_config)
        if hasattr(cfg, "dtype"):
            cfg.dtype = emb_dtype
        cfg.save_pretrained(str(tmp))
        for stale in list(root.glob("*.safetensors")) + [root / SAFETENSORS_INDEX]:
            if stale.exists():
                stale.unlink()
        for f in tmp.iterdir():
            os.replace(f, root / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [root / n for n in names]


def _shard_file(tp: int, ep: int, pp: int) -> str:
    return f"mp_rank_{tp:02d}_{ep:03d}_{pp:03d}.pt"


def save_megatron_checkpoint(
    path: str | os.PathLike,
    shards: Mapping[tuple[int, int, int], Mapping[str, Any]],
    meta: Mapping[str, Any],
) -> None:
    """One `torch.save` file per (tp, ep, pp) rank plus `megatron_meta.json`.

    meta: `tp`, `ep`, `pp` sizes and `hf_config` (a PretrainedConfig or its dict); other keys are kept.
    The shards must be exactly the ranks of those sizes.
    """
    meta = dict(meta)
    for k in ("tp", "ep", "pp", "hf_config"):
        if k not in meta:
            raise ValueError(f"Megatron checkpoint meta needs {k!r}")
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    cfg = meta["hf_config"]
    cfg_obj = cfg if not isinstance(cfg, Mapping) else hf_config_from_dict(cfg)
    check_parallel_sizes(cfg_obj, tp, ep, pp)
    want = {(t, e, p) for t in range(tp) for e in range(ep) for p in range(pp)}
    if set(shards) != want:
        raise ValueError(f"shards {sorted(shards)} are not the ranks of tp={tp}, ep={ep}, pp={pp}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for (t, e, p), sd in shards.items():
        torch.save({k: (None if v is None else _own(v)) for k, v in sd.items()}, root / _shard_file(t, e, p))
    _write_meta(root, meta, cfg_obj)


def _write_meta(root: Path, meta: Mapping[str, Any], cfg_obj: Any) -> None:
    meta = dict(meta)
    meta["format"] = META_FORMAT
    meta["hf_config"] = cfg_obj.to_dict()
    meta["files"] = {
        f"{t},{e},{p}": _shard_file(t, e, p)
        for t in range(int(meta["tp"]))
        for e in range(int(meta["ep"]))
        for p in range(int(meta["pp"]))
    }
    (root / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")


def load_megatron_checkpoint(
    path: str | os.PathLike, mmap: bool = True
) -> tuple[Any, dict[tuple[int, int, int], dict[str, Any]], dict[str, Any]]:
    """(hf_config, shards keyed (tp, ep, pp), meta) of a directory written by `save_megatron_checkpoint`.

    With `mmap` the tensors stay on disk until used."""
    root = Path(path)
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"Megatron checkpoint {root} has no {META_FILE} ({meta_path})")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != META_FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {META_FORMAT!r}")
    hf_config = hf_config_from_dict(meta["hf_config"])
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    shards = {}
    for t in range(tp):
        for e in range(ep):
            for p in range(pp):
                f = root / _shard_file(t, e, p)
                if not f.is_file():
                    raise FileNotFoundError(f"Megatron checkpoint {root}: missing rank file {f.name} (tp={t}, ep={e}, pp={p})")
                shards[t, e, p] = torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)
    return hf_config, shards, meta


# --------------------------------------------------------------------------------------------------
# CLI

_DTYPES = {"keep": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _cast(sd: Mapping[str, torch.Tensor], dtype: Optional[torch.dtype]) -> Mapping[str, torch.Tensor]:
    if dtype is None:
        return sd
    shapes = {k: _shape(sd, k) for k in sd}
    return LazyStateDict(list(sd), lambda k: sd[k].to(dtype), shapes)


def _to_megatron(args: argparse.Namespace) -> None:
    hf_config, src = load_hf_checkpoint(args.hf_dir)
    print(f"[convert] {args.hf_dir}: {type(hf_config).__name__}, {len(src)} tensors", flush=True)
    check_parallel_sizes(hf_config, args.tp, args.ep, args.pp)
    etp = _check_etp(args.tp, args.etp)
    full = _cast(hf_to_megatron(src, hf_config), _DTYPES[args.dtype])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = args.tp * args.ep * args.pp
    i = 0
    for p in range(args.pp):
        for e in range(args.ep):
            for t in range(args.tp):
                i += 1
                shard = shard_megatron_state(full, hf_config, t, args.tp, e, args.ep, p, args.pp, etp_size=etp)
                f = out / _shard_file(t, e, p)
                torch.save(shard, f)
                n_t = sum(v is not None for v in shard.values())
                print(f"[convert] ({i}/{n}) wrote {f} ({n_t} tensors)", flush=True)
                del shard
    _write_meta(out, {"tp": args.tp, "ep": args.ep, "pp": args.pp, "etp": etp, "source": str(args.hf_dir)}, hf_config)
    print(f"[convert] wrote {out / META_FILE}", flush=True)


def _to_hf(args: argparse.Namespace) -> None:
    hf_config, shards, meta = load_megatron_checkpoint(args.megatron_dir)
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    etp = int(meta.get("etp", tp))
    print(f"[convert] {args.megatron_dir}: {type(hf_config).__name__}, tp={tp} ep={ep} pp={pp} etp={etp}", flush=True)
    full = gather_megatron_states(shards, hf_config, tp, ep, pp, etp_size=etp)
    hf = _cast(megatron_to_hf(full, hf_config), _DTYPES[args.dtype])
    save_hf_checkpoint(
        args.out, hf_config, hf, shard_size_mb=args.shard_size_mb, log=lambda s: print(f"[convert] {s}", flush=True)
    )
    print(f"[convert] wrote {Path(args.out) / 'config.json'}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m megatron_glue.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", choices=["megatron", "hf"], required=True)
    ap.add_argument("--hf-dir", help="input HF checkpoint directory (--to megatron)")
    ap.add_argument("--megatron-dir", help="input Megatron checkpoint directory (--to hf)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--etp", type=int, default=None,
                    help="expert tensor-parallel size: 1 (experts whole on each TP rank) or the TP size (default)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="keep")
    ap.add_argument("--shard-size-mb", type=float, default=4096, help="max safetensors file size (--to hf)")
    args = ap.parse_args(argv)
    try:
        if args.to == "megatron":
            if not args.hf_dir:
                ap.error("--to megatron needs --hf-dir")
            _to_megatron(args)
        else:
            if not args.megatron_dir:
                ap.error("--to hf needs --megatron-dir")
            _to_hf(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"[convert] error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
