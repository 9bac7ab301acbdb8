"""A bf16 embedded engine against the fp32 trainer: the GPU train-inference mismatch, reproduced on CPU,
measured by the step-0 consistency check and the trainer's mismatch metrics, and corrected by TIS."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from megatron_glue.model_provider import ParallelSizes
from megatron_glue.sharding import shard_megatron_state
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.weight_names import canonical_hf_state_dict, hf_to_megatron
from sglang_patches.decoding import SamplingParams
from slime_ext.config.schema import Config
from slime_ext.data import Sample
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.orchestration.consistency import ConsistencyError, check_consistency, consistency_report
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config

CONFIG = tiny_moe_config(initializer_range=0.2)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIG).eval()


def trainer_from(model, **kw) -> MegatronTrainer:
    single_process_parallel_state(seed=3)
    trainer = MegatronTrainer(CONFIG, TrainerSettings(**({"lr": 1e-12, "micro_batch_size": 8, "clip_grad": 0.0} | kw)),
                              ParallelSizes())
    hf = canonical_hf_state_dict(model.state_dict(), CONFIG)
    shard = shard_megatron_state(hf_to_megatron(hf, CONFIG), CONFIG, tp_rank=0, tp_size=1, ep_rank=0, ep_size=1,
                                 pp_rank=0, pp_size=1, etp_size=None)
    trainer.load_local_state_dict(dict(shard))
    return trainer


def rollouts(model, dtype) -> list[Sample]:
    engine = EmbeddedEngine(copy.deepcopy(model).to(dtype), eos_token_id=1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=24)
    prompts = [[5, 9, 13, 2 + i, 40 - i] for i in range(8)]
    results = engine.generate([GenerateRequest(f"r{i}", p, sp, seed=i) for i, p in enumerate(prompts)])
    return [Sample(f"s{i}", p, r.output_ids, logprobs=r.logprobs, advantage=(-1.0) ** i)
            for i, (p, r) in enumerate(zip(prompts, results))]


def cfg(**train) -> Config:
    c = Config()
    c.rollout.precision = "bf16"
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


def test_bf16_engine_mismatch_is_measured_checked_and_corrected(hf_model):
    trainer = trainer_from(hf_model, old_logprobs="trainer", mismatch_mode="truncate", mismatch_cap=1.01)
    fp32, bf16 = rollouts(hf_model, torch.float32), rollouts(hf_model, torch.bfloat16)
    same = consistency_report(fp32, trainer.compute_logprobs(fp32)["logprobs"])
    mixed = consistency_report(bf16, trainer.compute_logprobs(bf16)["logprobs"])
    # fp32 engine and fp32 trainer differ by kernel noise only; bf16 weights and activations by ~1e-2
    assert same["abs_diff_mean"] < 1e-5 and same["kl"] < 1e-9
    assert mixed["abs_diff_mean"] > 3e-3 and mixed["abs_diff_max"] > 3e-2 and mixed["kl"] > 1e-6

    # the step-0 check: passes in one precision, fails the same-precision tolerance on the bf16 engine
    fp32_cfg = cfg()
    fp32_cfg.rollout.precision = "fp32"
    assert check_consistency(same, fp32_cfg)["consistency/tolerance"] == 1e-3
    with pytest.raises(ConsistencyError, match=r"train.consistency_tolerance = 0.001.*rollout.precision = bf16"):
        check_consistency(mixed, cfg(consistency_tolerance=1e-3))
    assert check_consistency(mixed, cfg())["consistency/tolerance"] == 0.1  # the mixed-precision default passes

    # the trainer measures the same mismatch before its update, and TIS (cap 1.01) reweights the tokens:
    # the mean weight is the mean of min(exp(logp_trainer - logp_engine), 1.01)
    m = trainer.train_step(bf16)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(mixed["abs_diff_mean"], rel=1e-4)
    lp = trainer.compute_logprobs(bf16)["logprobs"]
    ratios = torch.cat([torch.exp(lp[s.sample_id].double() - torch.tensor(s.logprobs, dtype=torch.float64)) for s in bf16])
    assert m["mismatch/weight_mean"] == pytest.approx(float(ratios.clamp(max=1.01).mean()), rel=1e-4)
    assert m["mismatch/truncated_frac"] == pytest.approx(float((ratios > 1.01).double().mean()), abs=1e-6)
    assert 0 < m["mismatch/truncated_frac"] < 1 and not math.isclose(m["mismatch/weight_mean"], 1.0, abs_tol=1e-4)
