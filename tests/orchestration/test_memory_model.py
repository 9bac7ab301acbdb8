"""The plan's trainer memory estimate against the measured peak of the real trainer on CPU: three model sizes x
two micro-batch lengths (two of them in the default run, all six with `--slow`), each within 15% in total and in
its activation part (the part that grows with tokens).

Why: the plan refuses layouts by this estimate; a model of the memory that no measurement holds could refuse a
layout that fits or pass one that does not. When the trainer's code changes what it keeps for backward, or the
estimate's terms drift from it, this fails and names the shape.
"""

from __future__ import annotations

import gc

import pytest
import torch

from megatron_glue.hf_config import hf_config_from_model_config
from megatron_glue.memory_meter import PeakMemory, live_tensor_bytes
from slime_ext.config import load_config
from slime_ext.orchestration.memory_model import GIB, trainer_memory
from slime_ext.orchestration.plan import build_plan
from tests.conftest import CONFIGS
from tests.megatron_fixtures import single_process_parallel_state

TOLERANCE = 0.15
# (hidden, layers, heads, kv heads, head dim, expert ffn, experts, top-k, vocab, logprob chunk MiB)
SIZES = {
    "h64-moe": (64, 2, 4, 2, 16, 64, 4, 2, 4096, 128.0),
    "h128-moe": (128, 3, 8, 2, 16, 192, 8, 2, 8192, 1.0),
    "h256-moe": (256, 2, 8, 4, 32, 256, 4, 2, 16384, 8.0),
}
LENGTHS = (256, 768)  # tokens per sample; micro-batches of 2 samples
MICRO_BATCH = 2


def _config(size: str, length: int):
    h, layers, heads, kv, hd, ffn, experts, topk, vocab, chunk = SIZES[size]
    return load_config(CONFIGS / "grpo.yaml", [
        f"model.hidden_size={h}", f"model.num_layers={layers}", f"model.num_attention_heads={heads}",
        f"model.num_key_value_heads={kv}", f"model.head_dim={hd}", f"model.moe_intermediate_size={ffn}",
        f"model.num_experts={experts}", f"model.num_experts_per_tok={topk}", f"model.vocab_size={vocab}",
        "model.max_position_embeddings=2048", f"train.logprob_chunk_mb={chunk}", "train.precision=fp32",
        "train.parallel.data_parallel_size=1", f"train.micro_batch_size={MICRO_BATCH}",
        f"rollout.max_prompt_len={length // 2}", f"rollout.max_response_len={length // 2}",
    ]).config


def _measure(config, length: int) -> tuple[int, int]:
    """(static bytes: weights, gradients and Adam states after a first step; peak growth of a second step)."""
    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from slime_ext.data import Sample

    single_process_parallel_state()
    hf = hf_config_from_model_config(config.model)
    torch.manual_seed(0)
    gc.collect()
    before = live_tensor_bytes()
    trainer = MegatronTrainer(hf, TrainerSettings(micro_batch_size=MICRO_BATCH, precision="fp32",
                                                  logprob_chunk_mb=config.train.logprob_chunk_mb), ParallelSizes())
    g = torch.Generator().manual_seed(0)
    half = length // 2
    samples = [Sample(f"s{i}", torch.randint(1, hf.vocab_size, (half,), generator=g).tolist(),
                      torch.randint(1, hf.vocab_size, (half,), generator=g).tolist(), logprobs=[-1.0] * half,
                      advantage=1.0 - i) for i in range(MICRO_BATCH)]
    trainer.train_step(samples, kind="grpo")  # creates the Adam states
    static = live_tensor_bytes() - before
    with PeakMemory("cpu") as meter:
        trainer.train_step(samples, kind="grpo")
    del trainer
    gc.collect()
    return static, meter.growth_bytes


def _trainer_cases() -> list:
    """The smallest size at the short length and the largest vocabulary at the long one (the logits term, which
    grows with the rows' tokens) in the default run; the other four with `--slow` (~6 s each on a 2-core machine)."""
    default = {("h64-moe", LENGTHS[0]), ("h256-moe", LENGTHS[-1])}
    return [pytest.param(size, length, marks=() if (size, length) in default else pytest.mark.slow)
            for length in LENGTHS for size in SIZES]


def trainer_case(size: str, length: int) -> tuple[dict[str, float], float, float, float, float]:
    """(estimated terms in bytes, estimated static, estimated step growth, measured static, measured step growth) of
    one trainer case; results/memory_model_2026-12-07/measure.py prints the same numbers as ratios."""
    config = _config(size, length)
    plan = build_plan(config)
    estimate = trainer_memory(plan.model, plan.layout, config.cluster.gpu_memory_gib, config.train.logprob_chunk_mb,
                              MICRO_BATCH * length)
    comps = {k: v * GIB for k, v in estimate.components_gib.items()}
    static_est = comps["weights"] + comps["grads_fp32"] + comps["optimizer"]
    dynamic_est = sum(v for k, v in comps.items() if k not in ("weights", "grads_fp32", "optimizer"))
    return (comps, static_est, dynamic_est, *_measure(config, length))


@pytest.mark.parametrize("size, length", _trainer_cases())
def test_estimate_within_15_percent_of_the_measured_peak(size, length):
    comps, static_est, dynamic_est, static, growth = trainer_case(size, length)
    detail = (f"{size} x {MICRO_BATCH * length} tokens: static {static / 2**20:.1f} MiB measured vs "
              f"{static_est / 2**20:.1f} estimated; step peak growth {growth / 2**20:.1f} vs {dynamic_est / 2**20:.1f}; "
              "terms " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in comps.items()))
    assert abs(static_est - static) <= TOLERANCE * static, detail
    assert abs(dynamic_est - growth) <= TOLERANCE * growth, detail
    assert abs(static_est + dynamic_est - static - growth) <= TOLERANCE * (static + growth), detail


def test_the_plan_sizes_micro_batches_like_the_trainer():
    """The plan's tokens per micro-batch: micro_batch_size full-length rows, capped by max_tokens_per_gpu, never
    below one sequence (the trainer cuts micro-batches the same way: tests/megatron_glue/test_trainer.py)."""
    cfg = _config("h64-moe", 256)
    assert build_plan(cfg).trainer_memory.tokens_per_micro_batch == 512
    capped = load_config(CONFIGS / "grpo.yaml", ["train.parallel.data_parallel_size=1", "train.micro_batch_size=16",
                                                 "train.parallel.max_tokens_per_gpu=1000"]).config
    seq = capped.rollout.max_prompt_len + capped.rollout.max_response_len
    assert build_plan(capped).trainer_memory.tokens_per_micro_batch == max(seq, 1000)


# -- the embedded engine ----------------------------------------------------------------------------
# (hidden, head dim, expert ffn, vocab) x (prompt tokens, new tokens); 8 prompts x 8 samples
ENGINE_SIZES = {"h128-v4k": (128, 32, 256, 4096), "h256-v8k": (256, 64, 512, 8192), "h128-v16k": (128, 32, 256, 16384)}
ENGINE_LENGTHS = ((256, 64), (512, 160))


def _engine_config(size: str, prompt: int, new: int):
    h, hd, ffn, vocab = ENGINE_SIZES[size]
    return load_config(CONFIGS / "grpo.yaml", [
        f"model.hidden_size={h}", f"model.head_dim={hd}", f"model.moe_intermediate_size={ffn}",
        f"model.vocab_size={vocab}", "model.max_position_embeddings=2048", "rollout.prompts_per_step=8",
        "rollout.n_samples_per_prompt=8", f"rollout.max_prompt_len={prompt}", f"rollout.max_response_len={new}",
        "rollout.precision=fp32"]).config


def _measure_engine(config) -> tuple[int, int]:
    """(weights bytes, peak growth) of one generate call holding the whole rollout step (no EOS: every row
    generates max_response_len tokens; prompts of exactly max_prompt_len)."""
    import random

    from transformers import AutoModelForCausalLM

    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.embedded import EmbeddedEngine

    r = config.rollout
    torch.manual_seed(0)
    gc.collect()
    before = live_tensor_bytes()  # tensors other tests of this process left behind are not the engine's
    model = AutoModelForCausalLM.from_config(hf_config_from_model_config(config.model)).eval()
    weights = live_tensor_bytes() - before
    rng = random.Random(0)
    prompts = [[rng.randrange(2, config.model.vocab_size) for _ in range(r.max_prompt_len)]
               for _ in range(r.prompts_per_step)]
    requests = [GenerateRequest(f"p{i}s{j}", p, SamplingParams(temperature=1.0, max_new_tokens=r.max_response_len),
                                seed=i * 100 + j) for i, p in enumerate(prompts) for j in range(r.n_samples_per_prompt)]
    engine = EmbeddedEngine(model, -1, kernel="static")
    with PeakMemory("cpu") as meter:
        results = engine.generate(requests)
    assert all(len(res.output_ids) == r.max_response_len for res in results)
    return weights, meter.growth_bytes


def _engine_cases() -> list:
    """The largest vocabulary (the logits term, which grows with the rows' tokens) at both lengths in the default
    run; the other sizes (hidden 256, smaller vocabularies) with `--slow` (8-20 s each on a 2-core machine)."""
    return [pytest.param(size, *lengths, marks=() if size == "h128-v16k" else pytest.mark.slow)
            for lengths in ENGINE_LENGTHS for size in ENGINE_SIZES]


def engine_case(size: str, prompt: int, new: int):
    """(the plan's engine estimate, its non-weight terms in bytes, measured weights, measured generate growth) of one
    engine case; results/memory_model_2026-12-07/measure.py prints the same numbers as ratios."""
    config = _engine_config(size, prompt, new)
    est = build_plan(config).embedded_engine_memory
    weights, growth = _measure_engine(config)
    rest = sum(v * 2**20 for k, v in est.components_mib.items() if k != "weights")
    return est, rest, weights, growth


@pytest.mark.parametrize("size, prompt, new", _engine_cases())
def test_embedded_engine_estimate_within_15_percent(size, prompt, new):
    est, rest, weights, growth = engine_case(size, prompt, new)
    weights_est = est.components_mib["weights"] * 2**20
    detail = (f"{size}, {prompt}+{new} tokens x {est.rows} rows: weights {weights / 2**20:.1f} vs "
              f"{weights_est / 2**20:.1f} MiB, generate growth {growth / 2**20:.1f} vs {rest / 2**20:.1f}; "
              f"terms {est.components_mib}")
    assert abs(weights_est - weights) <= TOLERANCE * weights, detail
    assert abs(rest - growth) <= TOLERANCE * growth, detail
    assert abs(est.total_mib * 2**20 - weights - growth) <= TOLERANCE * (weights + growth), detail
