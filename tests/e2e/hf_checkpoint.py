"""A tiny random Qwen3-MoE HF checkpoint (weights, config.json, the project's tokenizer in the same
directory) and a small JSONL math data set: what an RL run from `model.hf_path` starts from in the
end-to-end tests (tests/e2e/test_hf_checkpoint_start.py, tests/e2e/test_launcher_cpu.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

# Deliberately not the embedded default's shape (configs/models/tiny-qwen3-moe.yaml: hidden 128, 4 layers,
# 8 experts), so a run that built its model from the YAML instead of the checkpoint's config.json fails.
TINY_MOE = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
    router_aux_loss_coef=0.001, max_position_embeddings=512, tie_word_embeddings=False,
    rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
    # a wide init: peaked next-token distributions, so a trainer that did not load these weights disagrees
    # with the engine's rollout logprobs by far more than numerical noise
    initializer_range=0.3,
)


def math_rows(n: int, seed: int) -> list[dict]:
    """`n` two-operand sums in the loader's row format (prompt, label, reference solution)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"prompt": f"What is {a} + {b}? Put the final answer in \\boxed{{}}.", "label": str(a + b),
                     "solution": f"{a} + {b} = {a + b}.\n\\boxed{{{a + b}}}"})
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_math_data(directory: Path, n_train: int = 16, n_eval: int = 8) -> tuple[Path, Path]:
    """train.jsonl and eval.jsonl under `directory`."""
    return (write_jsonl(math_rows(n_train, seed=1), directory / "train.jsonl"),
            write_jsonl(math_rows(n_eval, seed=2), directory / "eval.jsonl"))


def make_tiny_hf_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A random tiny Qwen3-MoE saved with `save_pretrained`, plus the project's byte-level BPE tokenizer
    (trained on the math rows and the chat markup) in the same directory, as a real checkpoint ships it."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from megatron_glue.hf_config import round_up
    from slime_ext.tokenizer import train_tokenizer

    texts = [f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n{r['solution']}"
             for r in math_rows(200, seed=3)]
    tokenizer = train_tokenizer(texts, vocab_size=320, out_dir=directory)
    # a vocabulary that splits evenly over tensor-parallel ranks, as Qwen3's 151936 does
    config = Qwen3MoeConfig(vocab_size=round_up(len(tokenizer), 64), **TINY_MOE)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory (safetensors), by name."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out
