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


def test_adapter_sync_is_refused_where_the_engines_could_not_serve_it():
    from slime_ext.config import ConfigError, load_config
    from tests.conftest import CONFIGS

    lora = CONFIGS / "grpo_lora.yaml"
    servers = ["train.lora.sync=adapter", "rollout.engine=sglang", "cluster.colocate_sleep=false"]
    assert load_config(lora, servers + ["sglang.weight_sync=tensor"]).config.train.lora.sync == "adapter"
    refusals = {
        "train.lora.rank >= 1": ["train.lora.sync=adapter", "train.lora.rank=0"],
        "sglang.weight_sync=tensor": servers + ["sglang.weight_sync=disk"],
        "cluster.colocate_sleep=false": ["train.lora.sync=adapter", "rollout.engine=sglang", "sglang.weight_sync=tensor"],
        "switch adapters mid-response": ["train.lora.sync=adapter", "rollout.max_staleness=1",
                                         "rollout.partial_rollouts=true"],
        "sglang.snapshot_every=0": servers + ["sglang.weight_sync=tensor", "sglang.snapshot_every=2"],
    }
    for needle, overrides in refusals.items():
        with pytest.raises(ConfigError, match=needle.replace("+", "\\+")):
            load_config(lora, overrides)
    with pytest.raises(ConfigError, match="hold a partner model"):
        load_config(CONFIGS / "tandem.yaml", ["train.lora.rank=4", "train.lora.sync=adapter"])


def test_sglang_engines_are_started_to_serve_the_adapter(tmp_path):
    plan = build_plan(reference_config(tmp_path, "train.lora.rank=32", "train.lora.sync=adapter",
                                       "cluster.colocate_sleep=false"))
    command = plan.rollout.server_command
    i = command.index("--enable-lora")
    # Qwen3-30B-A3B: the attention only (its MLPs are routed experts, not adapted)
    assert command[i:] == ["--enable-lora", "--max-lora-rank", "32", "--lora-target-modules", "k_proj", "o_proj",
                           "q_proj", "v_proj", "--max-loras-per-batch", "1"]


EXPERTS = "train.lora.target_modules=[linear_qkv,linear_proj,experts]"


def test_expert_adapters_by_hand(tmp_path):
    from slime_ext.orchestration.memory_model import lora_expert_params_per_rank

    attention = build_plan(reference_config(tmp_path, "train.lora.rank=32", "train.parallel.optimizer_cpu_offload=false"))
    plan = build_plan(reference_config(tmp_path, "train.lora.rank=32", "train.parallel.optimizer_cpu_offload=false",
                                       EXPERTS))
    assert (plan.layout.ep, plan.layout.etp, plan.layout.dp, plan.layout.expert_dp) == (8, 1, 2, 1)
    # 48 layers x 128 / EP 8 = 16 local experts, each fc1 A [32, 2048] + B [2 x 768, 32] and fc2 A [32, 768] +
    # B [2048, 32], whole (expert-TP 1)
    experts = 48 * 16 * 32 * ((2048 + 2 * 768) + (768 + 2048))
    assert lora_expert_params_per_rank(plan.model, plan.layout, 32, ("linear_qkv", "experts")) == experts == 157_286_400
    assert lora_expert_params_per_rank(plan.model, plan.layout, 32, ("linear_qkv",)) == 0
    dense = 9_830_400  # the attention adapters (test above)
    t = plan.trainer_memory
    assert t.lora_params == dense + experts
    assert t.components_gib["grads_fp32"] == pytest.approx(4 * (dense + experts) / GIB, abs=1e-3)
    # Adam's state: the attention adapters sharded over DP 2, the experts' over expert-DP 1
    assert t.components_gib["optimizer"] == pytest.approx(12 * (dense / 2 + experts) / GIB, abs=1e-3)
    assert t.total_gib == pytest.approx(attention.trainer_memory.total_gib + (2 + 4 + 12) * experts / GIB, abs=5e-3)


def test_expert_adapters_are_served_and_refused_where_experts_are_split():
    from slime_ext.config import ConfigError, load_config
    from slime_ext.engine.lora_sync import lora_server_args
    from tests.conftest import CONFIGS

    lora = CONFIGS / "grpo_lora.yaml"
    cfg = load_config(lora, [EXPERTS, "train.lora.sync=adapter", "rollout.engine=sglang", "cluster.colocate_sleep=false",
                             "sglang.weight_sync=tensor", "model.arch=qwen3_moe"]).config
    args = lora_server_args(cfg)
    i = args.index("--lora-target-modules")
    assert args[i + 1:i + 8] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    with pytest.raises(ConfigError, match="expert_tensor_parallel_size=1"):
        load_config(lora, [EXPERTS, "train.parallel.tensor_model_parallel_size=2"])
    split = load_config(lora, [EXPERTS, "train.parallel.tensor_model_parallel_size=2",
                               "train.parallel.expert_tensor_parallel_size=1"]).config
    assert "experts" in split.train.lora.target_modules
