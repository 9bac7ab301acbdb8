"""The plan of LoRA RL (`train.lora`): adapter parameters per GPU by hand, gradients and optimizer state for the
adapters only, and the 30B launcher's dry run on 2 GPUs, which LoRA passes and full training does not."""

from __future__ import annotations

import pytest

from slime_ext.orchestration.memory_model import GIB, lora_params_per_rank
from slime_ext.orchestration.plan import build_plan
from tests.orchestration.test_plan import _launcher, reference_config

SMALL = ["train.parallel.tensor_model_parallel_size=2", "train.parallel.expert_model_parallel_size=2",
         "sglang.tp_size=2", "sglang.mem_fraction_static=0.85"]


def test_adapter_parameters_and_their_memory_by_hand(tmp_path):
    base = build_plan(reference_config(tmp_path))
    plan = build_plan(reference_config(tmp_path, "train.lora.rank=32", "train.parallel.optimizer_cpu_offload=false"))
    # Qwen3-30B-A3B at TP 4: per layer A [32, 2048] + B [(4096 + 2 x 512) / 4, 32] on q/k/v, A [32, 4096 / 4] +
    # B [2048, 32] on the attention output; MoE layers: no dense MLP, experts not adapted; 48 layers
    adapters = 48 * 32 * (2048 + (4096 + 2 * 512) // 4 + 4096 // 4 + 2048)
    assert lora_params_per_rank(plan.model, plan.layout, 32, ("linear_qkv", "linear_proj", "linear_fc1",
                                                              "linear_fc2")) == adapters == 9_830_400
    t = plan.trainer_memory
    assert t.components_gib["grads_fp32"] == pytest.approx(4 * adapters / GIB, abs=1e-3)
    # bf16: fp32 main params + Adam's two moments, sharded over DP = 2
    assert t.components_gib["optimizer"] == pytest.approx(12 * adapters / 2 / GIB, abs=1e-3)
    assert t.components_gib["weights"] == pytest.approx(base.trainer_memory.components_gib["weights"]
                                                        + 2 * adapters / GIB, abs=2e-3)
    assert t.total_gib < base.trainer_memory.total_gib - 14  # the full model's 15 GiB of fp32 gradients gone
    from slime_ext.orchestration.plan_format import format_plan

    assert "LoRA: 9.83M adapter params per GPU train" in format_plan(plan)


def test_the_dense_mlp_is_adapted_in_a_dense_model(tmp_path):
    plan = build_plan(reference_config(tmp_path, "train.lora.rank=8"))
    shape = plan.model.__class__(**{**plan.model.__dict__, "num_experts": 0, "dense_ffn": 6144})
    per_layer = 8 * ((2048 + 5120 // 4) + (4096 // 4 + 2048) + (2048 + 2 * 6144 // 4) + (6144 // 4 + 2048))
    assert lora_params_per_rank(shape, plan.layout, 8, ("linear_qkv", "linear_proj", "linear_fc1",
                                                        "linear_fc2")) == 48 * per_layer
    assert lora_params_per_rank(shape, plan.layout, 8, ("linear_qkv",)) == 48 * 8 * (2048 + 5120 // 4)
    assert lora_params_per_rank(shape, plan.layout, 0, ("linear_qkv",)) == 0


def test_lora_rank_32_passes_the_launchers_dry_run_on_two_gpus_where_full_training_does_not(tmp_path):
    lora = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--dry-run", *SMALL, "train.lora.rank=32", GPUS_PER_NODE="2")
    assert lora.returncode == 0, lora.stderr
    assert "cluster: 1 node(s) x 2 GPUs" in lora.stdout and "world=2 TP=2" in lora.stdout
    full = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--dry-run", *SMALL, GPUS_PER_NODE="2")
    assert full.returncode == 3 and "grads_fp32 56.89 GiB" in full.stderr
