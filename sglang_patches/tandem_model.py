"""Tandem's two-model SGLang path: senior and junior in one out-of-tree model.

SGLang serves one model per engine, so the pair is packaged as one: `TandemQwen3MoeForCausalLM` holds
two SGLang `Qwen3MoeForCausalLM` stacks and runs both on every forward. Its config says
`num_hidden_layers = 2L`, so SGLang's KV pool allocates 2L layers behind ONE block table (one
`req_to_token` row per request, shared by both models): the senior's attention layers use KV layers
0..L-1 and the junior's are renumbered to L..2L-1. Both models consume every emitted token (lockstep).

The forward returns `[senior logits | junior logits - JUNIOR_LOGIT_OFFSET]` (width 2V). Our
`SamplerLogitProcessor` (sglang_adapter, custom param `partner_vocab=V`) splits each row, lets the
tandem sampler pick the author's half, writes it into the first V columns and masks the rest, so the
sampled id is always < V and SGLang's logprob is the author's. A request without the processor samples
from the senior alone (the offset puts the junior half at probability exp(-1000) = 0).

Load it with `SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_patches.tandem_model` and a model directory made by
`write_tandem_checkpoint` (the senior's files plus a config naming the architecture and the junior's
path). Weight updates (`update_weights_from_tensor`) carry plain HF names and reach the senior only;
names under `junior.` are refused, so the junior stays frozen. `scripts/tandem_sglang_smoke.py` checks
it on a GPU server; what only a live server can verify is listed there.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import torch

ARCHITECTURE = "TandemQwen3MoeForCausalLM"
JUNIOR_PREFIX = "junior."
JUNIOR_LOGIT_OFFSET = 1000.0
CONFIG_KEYS = ("tandem_layers", "tandem_junior_path")


def combine_logits(senior: torch.Tensor, junior: torch.Tensor) -> torch.Tensor:
    """[B, V] x 2 -> [B, 2V]: the senior's logits, then the junior's pushed out of reach."""
    if senior.shape != junior.shape:
        raise ValueError(f"senior logits {tuple(senior.shape)} and junior logits {tuple(junior.shape)} differ")
    return torch.cat([senior, junior - JUNIOR_LOGIT_OFFSET], dim=-1)


def split_logits(row: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `combine_logits` for one row (or a batch): (senior, junior)."""
    if row.shape[-1] != 2 * vocab:
        raise ValueError(f"a tandem logits row has width {row.shape[-1]}, expected 2 x vocab = {2 * vocab}")
    return row[..., :vocab], row[..., vocab:] + JUNIOR_LOGIT_OFFSET


def route_weight(name: str) -> tuple[str, str]:
    """('junior', inner name) for `junior.`-prefixed names, else ('senior', name)."""
    if name.startswith(JUNIOR_PREFIX):
        return "junior", name[len(JUNIOR_PREFIX):]
    return "senior", name


def tandem_config(senior_config: Any, junior_path: str) -> Any:
    """The served config: the senior's, with 2L layers (for the KV pool) and the pair recorded."""
    config = copy.deepcopy(senior_config)
    layers = int(senior_config.num_hidden_layers)
    config.tandem_layers = layers
    config.tandem_junior_path = str(junior_path)
    config.num_hidden_layers = 2 * layers
    config.architectures = [ARCHITECTURE]
    return config


def inner_config(config: Any) -> Any:
    """One model's config from the served one (L layers)."""
    if not hasattr(config, "tandem_layers"):
        raise ValueError(f"not a tandem config (no 'tandem_layers'); build the model dir with write_tandem_checkpoint")
    inner = copy.deepcopy(config)
    inner.num_hidden_layers = int(config.tandem_layers)
    inner.architectures = ["Qwen3MoeForCausalLM"]
    return inner


def shift_attention_layer_ids(module: torch.nn.Module, offset: int) -> int:
    """Renumber every attention layer's KV-pool index by `offset` (the junior's layers follow the
    senior's in the shared pool). Returns how many layers moved."""
    moved = 0
    for sub in module.modules():
        if type(sub).__name__ == "RadixAttention" and hasattr(sub, "layer_id"):
            sub.layer_id = int(sub.layer_id) + offset
            moved += 1
    return moved


def write_tandem_checkpoint(senior_dir: str | Path, junior_dir: str | Path, out_dir: str | Path) -> Path:
    """A model directory SGLang can serve as the tandem pair: the senior's weights and tokenizer
    (symlinked) and a config.json with the tandem architecture and the junior's path. The junior must
    have the senior's vocabulary and shape (checked)."""
    from sglang_patches.tandem import check_same_vocabulary
    from transformers import AutoConfig, AutoTokenizer

    senior_dir, junior_dir, out = Path(senior_dir), Path(junior_dir), Path(out_dir)
    s_cfg, j_cfg = AutoConfig.from_pretrained(senior_dir), AutoConfig.from_pretrained(junior_dir)
    shape_keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "num_experts", "vocab_size")
    diff = {k: (getattr(s_cfg, k, None), getattr(j_cfg, k, None)) for k in shape_keys
            if getattr(s_cfg, k, None) != getattr(j_cfg, k, None)}
    if diff:
        raise ValueError(f"senior {senior_dir} and junior {junior_dir} differ in shape: {diff} "
                         "(the shared KV pool needs identical layers)")
    check_same_vocabulary(AutoTokenizer.from_pretrained(senior_dir).get_vocab(),
                          AutoTokenizer.from_pretrained(junior_dir).get_vocab())
    out.mkdir(parents=True, exist_ok=True)
    for f in senior_dir.iterdir():
        if f.name != "config.json" and f.is_file() and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((senior_dir / "config.json").read_text())
    layers = int(config["num_hidden_layers"])
    config.update(architectures=[ARCHITECTURE], num_hidden_layers=2 * layers, tandem_layers=layers,
                  tandem_junior_path=str(junior_dir.resolve()))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def junior_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The junior checkpoint's tensors (safetensors files), HF names."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"tandem junior {path}: no *.safetensors files")
    for f in files:
        yield from load_file(str(f)).items()


def _build_entry_class() -> Optional[type]:
    """The SGLang model class, defined only where SGLang's model code imports (GPU servers)."""
    try:
        from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
        from sglang.srt.utils import add_prefix
    except Exception:  # noqa: BLE001 - SGLang's model stack needs CUDA-only packages
        return None

    class TandemQwen3MoeForCausalLM(torch.nn.Module):
        """Senior + junior Qwen3-MoE with one shared block table and separate KV layers."""

        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__()
            self.config = config
            inner = inner_config(config)
            self.senior = Qwen3MoeForCausalLM(inner, quant_config, prefix=add_prefix("senior", prefix))
            self.junior = Qwen3MoeForCausalLM(inner, quant_config, prefix=add_prefix("junior", prefix))
            moved = shift_attention_layer_ids(self.junior, inner.num_hidden_layers)
            if moved != inner.num_hidden_layers:
                raise RuntimeError(f"tandem: renumbered {moved} junior attention layers, expected {inner.num_hidden_layers}")
            self.junior.requires_grad_(False)

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.senior.get_input_embeddings()

        @torch.no_grad()
        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                    input_embeds: Optional[torch.Tensor] = None, **kwargs: Any) -> Any:
            out = self.senior(input_ids, positions, forward_batch, input_embeds)
            junior = self.junior(input_ids, positions, forward_batch, input_embeds)
            out.next_token_logits = combine_logits(out.next_token_logits, junior.next_token_logits)
            return out

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
            senior: list[tuple[str, torch.Tensor]] = []
            junior: list[tuple[str, torch.Tensor]] = []
            for name, tensor in weights:
                side, inner_name = route_weight(name)
                (junior if side == "junior" else senior).append((inner_name, tensor))
            if junior and getattr(self, "_loaded", False):
                raise ValueError(f"tandem: weight update names the frozen junior ({junior[0][0]!r} ...)")
            self.senior.load_weights(senior)
            if not getattr(self, "_loaded", False):  # first load: the junior from its own checkpoint
                self.junior.load_weights(junior or list(junior_weights(self.config.tandem_junior_path)))
                self._loaded = True

    return TandemQwen3MoeForCausalLM


_ENTRY = _build_entry_class()
EntryClass = [_ENTRY] if _ENTRY is not None else []

