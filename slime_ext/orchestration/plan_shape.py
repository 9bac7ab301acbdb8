"""The model's shape for the plan: the few architecture numbers it needs, read from the checkpoint's
config.json when `model.hf_path` exists, else from the YAML's model fields (a dry run on a machine without
the checkpoint), and its parameter counts by how the trainer shards them. The memory model and the layouts read
these; this module reads neither (it sits below both)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from slime_ext.config.schema import Config, ModelConfig


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts by how the trainer shards them."""

    num_layers: int
    attention: int  # per layer: q, k, v, o projections (TP-split)
    replicated: int  # per layer: 2 norms, q/k norms, router (on every TP rank)
    experts: int  # per layer: all experts' gate, up, down (EP-split)
    dense_mlp: int  # per layer: dense gate, up, down (TP-split); 0 for MoE
    embedding: int
    output: int  # 0 when tied
    final_norm: int

    @property
    def total(self) -> int:
        per_layer = self.attention + self.replicated + self.experts + self.dense_mlp
        return self.num_layers * per_layer + self.embedding + self.output + self.final_norm


def _head_dim(hf: Any) -> int:
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def _num_experts(hf: Any) -> int:
    return int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", 0) or 0)


def param_split(hf: Any) -> ParamSplit:
    """Count parameters per sharding kind; the sum equals `megatron_glue.hf_config.parameter_counts`."""
    h, hd, experts = hf.hidden_size, _head_dim(hf), _num_experts(hf)
    attention = h * hd * (2 * hf.num_attention_heads + 2 * hf.num_key_value_heads)
    replicated = 2 * h + 2 * hd + experts * h  # input/post-attention norms, q/k norms, router
    expert_params = experts * 3 * h * hf.moe_intermediate_size if experts else 0
    dense = 0 if experts else 3 * h * hf.intermediate_size
    embedding = hf.vocab_size * h
    return ParamSplit(
        num_layers=hf.num_hidden_layers, attention=attention, replicated=replicated, experts=expert_params,
        dense_mlp=dense, embedding=embedding, output=0 if hf.tie_word_embeddings else embedding, final_norm=h,
    )


@dataclass(frozen=True)
class ModelShape:
    """The few architecture numbers the plan needs, read from an HF config."""

    name: str
    source: str  # "hf_path" (checkpoint config.json) or "yaml" (model fields of the config)
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    top_k: int
    moe_ffn: int
    dense_ffn: int
    params_total: int
    params_active: int
    split: ParamSplit


def _checkpoint_exists(path: Optional[str]) -> bool:
    return bool(path) and (Path(path) / "config.json").is_file()


def load_model_shape(config: Config) -> tuple[ModelShape, list[str]]:
    """Architecture from the checkpoint's config.json when `model.hf_path` exists, else from the YAML's
    model fields (a dry run on a machine without the checkpoint), with a warning saying so."""
    from megatron_glue.hf_config import hf_config_from_model_config, parameter_counts

    warnings: list[str] = []
    model: ModelConfig = config.model
    source = "hf_path"
    if not _checkpoint_exists(model.hf_path):
        if model.hf_path:
            warnings.append(f"model.hf_path={model.hf_path} does not exist (no config.json): "
                            "using the model fields of the YAML")
        model = model.model_copy(update={"hf_path": None})
        source = "yaml"
    tok_vocab = config.tokenizer.vocab_size if model.vocab_size is None else None
    hf = hf_config_from_model_config(model, tokenizer_vocab=tok_vocab)
    split = param_split(hf)
    counts = parameter_counts(hf)
    if counts["total"] != split.total:  # two independent counts of the same architecture
        raise AssertionError(f"parameter split {split.total} != parameter_counts {counts['total']}")
    experts = _num_experts(hf)
    shape = ModelShape(
        name=config.model.name, source=source, hidden=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads, head_dim=_head_dim(hf),
        vocab=hf.vocab_size, num_experts=experts, top_k=int(getattr(hf, "num_experts_per_tok", 0) or 0),
        moe_ffn=int(getattr(hf, "moe_intermediate_size", 0) or 0), dense_ffn=hf.intermediate_size,
        params_total=counts["total"], params_active=counts["active"], split=split,
    )
    return shape, warnings
