"""Train-step throughput: megatron_glue vs plain HF transformers on the same model, side by side.

Both train the same Qwen3-MoE (same weights, same padded batch, same masked cross-entropy, AdamW) for
the same number of steps in one process; we report tokens/s of each and their ratio. Presets:

- `cpu-tiny` (default): the embedded default model (~3.4M params), fp32, one thread.
- `gpu-moe`: a Qwen3-MoE-shaped model sized for one 80 GB GPU (~2.7B total parameters), bf16,
  Transformer Engine spec when TE imports (else the local spec); also reports model FLOPs
  utilisation (MFU) against the GPU's bf16 dense peak.

    python benchmarks/train_step.py                       # CPU
    python benchmarks/train_step.py --preset gpu-moe      # on a GPU machine
    python benchmarks/train_step.py --out results/bench   # also write JSON + markdown
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = {
    "cpu-tiny": dict(
        model=dict(hidden_size=128, num_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   intermediate_size=512, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
        vocab=320, batch=64, min_len=120, max_len=220, micro_batch=16, steps=4, warmup=1, dtype="fp32",
    ),
    "gpu-moe": dict(
        model=dict(hidden_size=2048, num_layers=12, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                   intermediate_size=6144, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=768),
        vocab=151936, batch=32, min_len=1024, max_len=2048, micro_batch=2, steps=6, warmup=2, dtype="bf16",
    ),
}
# MiB of fp32 logits per LM-head chunk for the Megatron trainer (train.logprob_chunk_mb); set by run_kit.py
LOGPROB_CHUNK_ENV = "BENCH_LOGPROB_CHUNK_MB"
GPU_PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def make_samples(preset: dict, seed: int = 0):
    from slime_ext.data import Sample

    rng = random.Random(seed)
    samples = []
    for i in range(preset["batch"]):
        n = rng.randint(preset["min_len"], preset["max_len"])
        p = n // 3
        ids = [rng.randrange(1, preset["vocab"]) for _ in range(n)]
        samples.append(Sample(f"b{i}", ids[:p], ids[p:]))
    return samples


def hf_config_for(preset: dict):
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config.schema import ModelConfig

    return hf_config_from_model_config(ModelConfig(vocab_size=preset["vocab"], max_position_embeddings=4096,
                                                   router_aux_loss_coef=0.0, **preset["model"]))


def time_megatron(preset: dict, hf_config, hf_state: dict, samples, device: str, grouped_experts: bool = True) -> dict:
    """megatron_glue's train step; `grouped_experts=False` times megatron-core's SequentialMLP loop instead."""
    if grouped_experts:
        return _time_megatron(preset, hf_config, hf_state, samples, device)
    from unittest import mock

    from megatron_glue.grouped_experts import GroupedSequentialMLP

    with mock.patch.object(GroupedSequentialMLP, "_grouped_applies", lambda self, hidden: False):
        return _time_megatron(preset, hf_config, hf_state, samples, device) | {"experts": "sequential loop"}


def _time_megatron(preset: dict, hf_config, hf_state: dict, samples, device: str) -> dict:
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from megatron_glue.sharding import shard_megatron_state
    from megatron_glue.weight_names import canonical_hf_state_dict, hf_to_megatron
    from megatron_glue.model_provider import ParallelSizes, transformer_engine_available
    from megatron_glue.parallel import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(ParallelSizes(), seed=0)
    chunk_mb = float(os.environ.get(LOGPROB_CHUNK_ENV, TrainerSettings.logprob_chunk_mb))
    trainer = MegatronTrainer(hf_config, TrainerSettings(lr=1e-5, micro_batch_size=preset["micro_batch"],
                                                         precision=preset["dtype"], logprob_chunk_mb=chunk_mb),
                              ParallelSizes())
    full = hf_to_megatron(canonical_hf_state_dict(hf_state, hf_config), hf_config)
    trainer.load_local_state_dict(shard_megatron_state(full, hf_config, 0, 1))
    return _time(lambda: trainer.train_step(samples, kind="sft"), preset, samples, device) | {
        "layer_spec": "transformer_engine" if transformer_engine_available() else "local",
        "logprob_chunk_mb": chunk_mb}


def time_hf(preset: dict, hf_config, hf_state: dict, samples, device: str) -> dict:
    from transformers import AutoModelForCausalLM

    from slime_ext.data import build_batch

    dtype = torch.bfloat16 if preset["dtype"] == "bf16" else torch.float32
    with torch.device(device):  # built where it trains (a large model's CPU init is slow)
        model = AutoModelForCausalLM.from_config(hf_config).to(dtype)
    model.load_state_dict(hf_state)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    mbs = preset["micro_batch"]
    chunks = [build_batch(samples[i : i + mbs], pad_id=0) for i in range(0, len(samples), mbs)]
    total = sum(float(c.loss_mask.sum()) for c in chunks)

    def step():
        opt.zero_grad(set_to_none=True)
        for c in chunks:
            tokens = c.tokens.to(device)
            logits = model(input_ids=tokens, attention_mask=c.attention_mask.to(device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]
            (-(logp * c.loss_mask[:, 1:].to(device)).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return _time(step, preset, samples, device)


def _time(step, preset: dict, samples, device: str) -> dict:
    for _ in range(preset["warmup"]):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(preset["steps"]):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / preset["steps"]
    tokens = sum(s.total_len for s in samples)
    return {"seconds_per_step": seconds, "tokens_per_s": tokens / seconds, "tokens_per_step": tokens}


def model_flops_per_token(hf_config, seq_len: float) -> float:
    """Training matmul FLOPs per token (benchmarks/flops.py: forward + backward, causal attention)."""
    from benchmarks.flops import train_flops_per_token

    return train_flops_per_token(hf_config, seq_len)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None)
    parser.add_argument("--out", type=Path, default=None, help="directory for results JSON + markdown")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--compare-experts", action="store_true",
                        help="also time megatron-core's SequentialMLP loop (the experts before grouped matmuls)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset_name = args.preset or ("gpu-moe" if device == "cuda" else "cpu-tiny")
    preset = PRESETS[preset_name]
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    hf_config = hf_config_for(preset)
    from transformers import AutoModelForCausalLM

    hf_state = {k: v.clone() for k, v in AutoModelForCausalLM.from_config(hf_config).state_dict().items()}
    samples = make_samples(preset)
    print(f"[bench] preset {preset_name} on {device}: {len(samples)} samples, "
          f"{sum(s.total_len for s in samples)} tokens/step, dtype {preset['dtype']}", flush=True)
    results = {"megatron_glue": time_megatron(preset, hf_config, hf_state, samples, device)}
    print(f"[bench] megatron_glue: {results['megatron_glue']['tokens_per_s']:.0f} tokens/s", flush=True)
    if args.compare_experts:
        loop = time_megatron(preset, hf_config, hf_state, samples, device, grouped_experts=False)
        results["megatron_glue_sequential_experts"] = loop
        print(f"[bench] megatron_glue with the SequentialMLP loop: {loop['tokens_per_s']:.0f} tokens/s", flush=True)
    if not args.skip_hf:
        results["hf_transformers"] = time_hf(preset, hf_config, hf_state, samples, device)
        print(f"[bench] hf transformers: {results['hf_transformers']['tokens_per_s']:.0f} tokens/s", flush=True)
        ratio = results["megatron_glue"]["tokens_per_s"] / results["hf_transformers"]["tokens_per_s"]
        results["ratio_megatron_over_hf"] = ratio
        print(f"[bench] ratio megatron_glue / hf = {ratio:.2f}x")
    if device == "cuda":
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in GPU_PEAK_BF16_TFLOPS.items() if k in name), None)
        mean_len = sum(s.total_len for s in samples) / len(samples)
        flops = model_flops_per_token(hf_config, mean_len)
        for key in ("megatron_glue", "hf_transformers"):
            if key in results and peak:
                results[key]["mfu"] = results[key]["tokens_per_s"] * flops / (peak * 1e12)
                print(f"[bench] {key} MFU {results[key]['mfu']:.1%} of {peak} TFLOP/s")
    meta = {"preset": preset_name, "device": device, "machine": platform.node(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python benchmarks/train_step.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"train_step_{preset_name}"
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
        lines = [f"# train-step benchmark ({preset_name}, {device})", "", f"- command: `{meta['command']}`",
                 f"- date: {meta['date']}, torch {meta['torch']}, threads {meta['threads']}, gpu {meta['gpu']}", "",
                 "| trainer | s/step | tokens/s |", "| --- | --- | --- |"]
        for key in ("megatron_glue", "megatron_glue_sequential_experts", "hf_transformers"):
            if key in results:
                lines.append(f"| {key} | {results[key]['seconds_per_step']:.3f} | {results[key]['tokens_per_s']:.0f} |")
        if "ratio_megatron_over_hf" in results:
            lines += ["", f"megatron_glue / hf throughput ratio: **{results['ratio_megatron_over_hf']:.2f}x**"]
        stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print(f"[bench] wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
