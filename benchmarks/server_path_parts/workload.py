"""The benchmark's workload: the default job's rollout settings, its model (random weights, a trained
tokenizer) as an HF directory, ragged request lengths and the requests themselves."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = dict(hidden_size=32, num_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  intermediate_size=64, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)


def default_workload() -> dict[str, Any]:
    """The rollout settings and model fields of configs/grpo.yaml, resolved by the config loader."""
    from slime_ext.config import load_config

    cfg = load_config(ROOT / "configs/grpo.yaml").config
    return {"prompts": cfg.rollout.prompts_per_step, "n": cfg.rollout.n_samples_per_prompt,
            "max_len": cfg.rollout.max_response_len, "temperature": cfg.rollout.temperature,
            "threads": cfg.rollout.threads, "vocab_size": cfg.tokenizer.vocab_size,
            "n_tokenizer_texts": cfg.tokenizer.n_training_texts, "template": cfg.data.template,
            "model": cfg.model}


def build_model_dir(out: Path, model_cfg: Any, vocab_size: int, n_texts: int, seed: int = 0) -> list[dict]:
    """Tokenizer (trained on the default task's text, as the tokenizer stage does) + random model, as an HF
    dir in `out`. Returns the synthetic-math rows the prompts come from."""
    from transformers import AutoModelForCausalLM

    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.tasks.synthetic_math import generate_dataset
    from slime_ext.tokenizer import train_tokenizer

    rows = generate_dataset(["L2"], n_texts, seed, "train")
    tok = train_tokenizer([r["prompt"] + "\n" + r["solution"] for r in rows], vocab_size=vocab_size, out_dir=out)
    torch.manual_seed(seed)
    hf = hf_config_from_model_config(model_cfg.model_copy(update={"vocab_size": len(tok)}))
    AutoModelForCausalLM.from_config(hf).eval().save_pretrained(out)
    return rows


def ragged_lengths(count: int, max_len: int, seed: int = 1) -> list[int]:
    """benchmarks/decode.py's rule: request i needs a length drawn from [max_len/8, max_len]."""
    rng = random.Random(seed)
    return [rng.randint(max(1, max_len // 8), max_len) for _ in range(count)]


def make_requests(prompt_ids: list[list[int]], n: int, lengths: list[int], temperature: float, tag: str) -> list:
    """`n` requests per prompt (rids `<tag>-p<i>-k<k>`, seeds 1000 i + k), request j capped at `lengths[j]`."""
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    reqs = []
    for i, ids in enumerate(prompt_ids):
        for k in range(n):
            j = i * n + k
            sp = SamplingParams(temperature=temperature, max_new_tokens=lengths[j])
            reqs.append(GenerateRequest(f"{tag}-p{i}-k{k}", ids, sp, seed=1000 * i + k))
    return reqs


def load_named(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The HF-named weights of the model directory's safetensors files."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return list(weights.items())
