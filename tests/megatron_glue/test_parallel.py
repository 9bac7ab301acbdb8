"""TP / EP / PP / DP on two gloo processes give the single-process loss and gradient norm."""

from __future__ import annotations

import random

import pytest
import torch

from tests.distributed import run_ranks
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config

RTOL = 1e-5


def _samples():
    from slime_ext.data import Sample

    rng = random.Random(7)
    out = []
    for i in range(6):
        r = rng.randint(4, 10)
        out.append(Sample(f"s{i}", [rng.randrange(2, 64) for _ in range(rng.randint(3, 6))],
                          [rng.randrange(2, 64) for _ in range(r)], logprobs=[-2.0 - 0.1 * j for j in range(r)],
                          advantage=(-1.0) ** i * (1 + 0.1 * i), weight=1.0 + 0.25 * (i % 3)))
    return out


def _hf_weights(config):
    from transformers import AutoModelForCausalLM

    from megatron_glue.weight_names import canonical_hf_state_dict

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    sd = {k: v.detach().clone() for k, v in canonical_hf_state_dict(model.state_dict(), config).items()}
    for k in sd:
        if k.endswith("norm.weight"):
            sd[k] = 1.0 + 0.1 * torch.randn_like(sd[k])
    return sd


def _worker(rank, config, hf_sd, sizes, steps, extra_settings=None):
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings
    from slime_ext.algo import LossSpec
    from megatron_glue.sharding import shard_megatron_state
    from megatron_glue.weight_names import hf_to_megatron
    from megatron_glue.parallel import init_model_parallel
    from megatron.core import parallel_state as mpu

    init_model_parallel(sizes, seed=11)
    trainer = MegatronTrainer(config, TrainerSettings(**({"lr": 1e-3, "micro_batch_size": 2, "loss": LossSpec(entropy_coef=0.01)}
                                                         | (extra_settings or {}))), sizes)
    shard = shard_megatron_state(
        hf_to_megatron(hf_sd, config), config,
        tp_rank=mpu.get_tensor_model_parallel_rank(), tp_size=sizes.tp,
        ep_rank=mpu.get_expert_model_parallel_rank(), ep_size=sizes.ep,
        pp_rank=mpu.get_pipeline_model_parallel_rank(), pp_size=sizes.pp, etp_size=sizes.expert_tp,
    )
    trainer.load_local_state_dict(dict(shard))
    from megatron_glue.weight_export import export_hf_state_dict

    # Gathered back to HF names across TP / EP / PP: must reproduce the loaded weights bit for bit.
    exported = export_hf_state_dict(trainer)
    # Buckets as a sync sends them, with a bound of twice the largest HF tensor (so one parameter's pieces,
    # e.g. a gated fc1's gate and up, always fit): (names, bytes) per bucket
    from megatron_glue.weight_export import iter_hf_weight_bucket_pairs, iter_hf_weight_buckets

    def nbytes(bucket):
        return sum(t.numel() * t.element_size() for _, t in bucket)

    bound = 2 * max(t.numel() * t.element_size() for t in hf_sd.values())
    buckets = [([n for n, _ in b], nbytes(b)) for b in iter_hf_weight_buckets(trainer, bucket_bytes=bound)]
    # a delta sender's pairs: the weights (fp32 here) with the engines' bf16 values of them, bounded together;
    # the bound fits one parameter's pair (a gated fc1: two fp32 HF tensors and their bf16 values)
    held = {k: v.detach().to(torch.bfloat16) for k, v in trainer.local_state_dict().items()}
    pair_bound = bound * 3 // 2
    pairs = [([n for n, _ in b], [n for n, _ in h], nbytes(b) + nbytes(h), {t.dtype for _, t in h})
             for b, h in iter_hf_weight_bucket_pairs(trainer, held, bucket_bytes=pair_bound)]
    samples = _samples()
    logprobs = trainer.compute_logprobs(samples)
    metrics = [trainer.train_step(samples, kind="grpo") for _ in range(steps)]
    return {"metrics": metrics, "logprobs": logprobs, "exported": exported, "buckets": buckets, "bound": bound,
            "pairs": pairs, "pair_bound": pair_bound}


def _run(config, sizes, world, extra_settings=None):
    hf_sd = _hf_weights(config)
    results = run_ranks(_worker, world, config, hf_sd, sizes, 2, extra_settings)
    union: dict = {}
    for r in results:
        union.update(r["exported"])
    assert set(union) == set(hf_sd) and all(torch.equal(union[k], hf_sd[k]) for k in hf_sd)
    # every rank walks the same buckets; none exceeds the bound, and together they hold this stage's weights
    # once (a bucket handed out only after the tensor that overflows it was added breaks the bound)
    for r in results:
        assert max(size for _, size in r["buckets"]) <= r["bound"], r["buckets"]
        names = [n for b, _ in r["buckets"] for n in b]
        assert sorted(names) == sorted(r["exported"]) and len(r["buckets"]) > 1
        # pairs hold the same names on both sides, every weight once, and both sides together within the bound
        # (counting only the weights lets a pair reach 1.5x its bound with bf16 values beside fp32 weights)
        assert all(weights == values and dtypes == {torch.bfloat16} for weights, values, _, dtypes in r["pairs"])
        assert sorted(n for weights, _, _, _ in r["pairs"] for n in weights) == sorted(r["exported"])
        assert max(size for _, _, size, _ in r["pairs"]) <= r["pair_bound"], [p[2] for p in r["pairs"]]
    return results


def _assert_same(result, reference):
    for got, want in zip(result["metrics"], reference["metrics"]):
        for key in ("pg_loss", "entropy", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=RTOL), key
    for sid, lp in reference["logprobs"]["logprobs"].items():
        assert torch.allclose(result["logprobs"]["logprobs"][sid], lp, rtol=RTOL, atol=1e-6)



@pytest.fixture(scope="module")
def moe_reference():
    from megatron_glue.model_provider import ParallelSizes

    return _run(tiny_moe_config(), ParallelSizes(), 1)[0]


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("tp2_sp", dict(tp=2, sequence_parallel=True)),
        ("ep2", dict(ep=2)),
        # slime's Qwen3-30B-A3B layout in miniature: TP and EP over the same ranks, experts whole (ETP 1)
        ("tp2_ep2_etp1", dict(tp=2, ep=2, etp=1, sequence_parallel=True)),
        ("pp2", dict(pp=2)),
        ("dp2", dict()),
    ],
)
def test_moe_layouts_match_single_process(name, sizes, moe_reference):
    from megatron_glue.model_provider import ParallelSizes

    results = _run(tiny_moe_config(), ParallelSizes(**sizes), 2)
    output = next(r for r in results if r["logprobs"] is not None)
    assert results[0]["metrics"] == results[1]["metrics"]  # every rank reports the same global metrics
    _assert_same(output, moe_reference)
    # the second step saw updated weights: equality there means the optimizer step matched too
    assert output["metrics"][1]["grad_norm"] != pytest.approx(output["metrics"][0]["grad_norm"], rel=1e-3)


@pytest.mark.slow
def test_dense_tp2_matches_single_process():
    from megatron_glue.model_provider import ParallelSizes

    config = tiny_dense_config(tie_word_embeddings=True)
    reference = _run(config, ParallelSizes(), 1)[0]
    results = _run(config, ParallelSizes(tp=2), 2)
    result = next(r for r in results if r["logprobs"] is not None)
    _assert_same(result, reference)


# mini-batch PPO with recomputed old logprobs and TIS: 3 optimizer steps per call (6 samples, 2 per mini-batch)
MINIBATCH = {"lr": 0.02, "global_batch_size": 2, "old_logprobs": "trainer", "mismatch_mode": "truncate",
             "mismatch_cap": 1.5}


@pytest.mark.parametrize("name, sizes", [
    pytest.param("pp2", dict(pp=2), marks=pytest.mark.slow),
    pytest.param("tp2_ep2_etp1", dict(tp=2, ep=2, etp=1, sequence_parallel=True), marks=pytest.mark.slow),
    ("dp2", dict()),  # the layout whose ranks cut each mini-batch between them
])
def test_minibatch_ppo_layouts_match_single_process(name, sizes):
    from megatron_glue.model_provider import ParallelSizes

    reference = _run(tiny_moe_config(), ParallelSizes(), 1, MINIBATCH)[0]
    results = _run(tiny_moe_config(), ParallelSizes(**sizes), 2, MINIBATCH)
    output = next(r for r in results if r["logprobs"] is not None)
    assert results[0]["metrics"] == results[1]["metrics"]
    # six Adam steps at lr 0.02 amplify the layouts' reduction-order noise (~1e-7) to ~1e-4; a wrong
    # denominator, sharding or old-logprob bookkeeping differs by orders of magnitude more
    for got, want in zip(output["metrics"], reference["metrics"]):
        assert got["optimizer_steps"] == want["optimizer_steps"] == 3
        for key in ("pg_loss", "entropy", "grad_norm", "clip_frac", "approx_kl_old", "mismatch/abs_diff_mean",
                    "mismatch/weight_mean", "ratio/p50", "ratio/p100"):
            assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-6), key
    # the engine's logprobs (-2 - 0.1 j) are far above the model's (~ -4.2): TIS weights r = pi_old / pi_e < 1
    # scale the tokens down; and the later mini-batches of the second call clip
    m = reference["metrics"]
    assert m[0]["mismatch/weight_mean"] < 0.5 and m[1]["clip_frac"] > 0, m
