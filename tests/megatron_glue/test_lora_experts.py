"""LoRA on the routed experts (`train.lora.target_modules: [..., experts]`): every expert's fc1 and fc2 get an
adapter; the grouped expert matmul (merged weights) computes what the per-expert loop with adapters does, output
and adapter gradients; the export is the merged model; the PEFT adapter names each expert's gate / up / down
projection and reproduces the merged HF weights; LoRA builds the local layer spec where Transformer Engine loads."""

from __future__ import annotations

import pytest
import torch

from megatron_glue.lora import LoRASpec
from megatron_glue.model_provider import ParallelSizes
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config
from tests.megatron_glue.test_lora_trainer import assert_adapter_reproduces, exported_adapter
from tests.megatron_glue.test_lora_trainer import make as make_trainer
from tests.megatron_glue.test_trainer import make_samples

EXPERT_SPEC = LoRASpec(rank=4, alpha=8.0, target_modules=("linear_qkv", "experts"))


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    single_process_parallel_state(seed=3)


def make(lora: LoRASpec = EXPERT_SPEC) -> MegatronTrainer:
    return make_trainer(lora, tiny_moe_config())


def _train_b(trainer: MegatronTrainer, seed: int = 0) -> None:
    """A trained adapter: every B non-zero (a fresh one is zero and changes nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for adapter in trainer.adapters.values():
            adapter.lora_b.copy_(torch.randn(adapter.lora_b.shape, generator=gen) * 0.3)


def test_every_expert_projection_gets_an_adapter_and_only_adapters_train():
    trainer = make()
    cfg = tiny_moe_config()
    experts = [k for k, a in trainer.adapters.items() if a.is_expert]
    assert len(experts) == cfg.num_hidden_layers * cfg.num_experts * 2  # fc1 and fc2 of every expert
    assert len(trainer.adapters) == len(experts) + cfg.num_hidden_layers  # + q/k/v (no dense MLP in this model)
    a = trainer.adapters["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1"]
    assert tuple(a.lora_a.shape) == (4, cfg.hidden_size) and tuple(a.lora_b.shape) == (2 * cfg.moe_intermediate_size, 4)
    before = {k: v.clone() for k, v in trainer.raw_state_dict().items()}
    trainer.train_step(make_samples(6), kind="sft")
    moved = {k for k, v in trainer.raw_state_dict().items() if not torch.equal(before[k], v)}
    assert all(k.rpartition(".")[2] in ("lora_a", "lora_b") for k in moved)
    assert any(".experts.local_experts." in k and k.endswith("lora_b") for k in moved)
    optimizer_params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(optimizer_params) == 2 * len(trainer.adapters)


def test_grouped_experts_with_adapters_equal_the_per_expert_loop(monkeypatch):
    """The grouped matmul stacks W + (alpha / r) B A per expert; SequentialMLP runs each expert's LoRALinear
    (base + B A x). Same log-probs, same adapter gradients."""
    from megatron_glue.grouped_experts import GroupedSequentialMLP

    samples = make_samples(4, seed=5)

    def run(grouped: bool) -> tuple[dict, dict]:
        trainer = make()
        _train_b(trainer)
        if not grouped:
            monkeypatch.setattr(GroupedSequentialMLP, "_grouped_applies", lambda self, hidden: False)
        logprobs = trainer.compute_logprobs(samples)["logprobs"]
        trainer.train_step(samples, kind="sft")
        grads = {n: p.main_grad.detach().clone() for n, p in trainer.model.module.named_parameters()
                 if p.requires_grad and ".experts." in n}
        monkeypatch.undo()
        return logprobs, grads

    probe = make()
    layer = probe.model.module.decoder.layers[0].mlp.experts
    hidden = torch.zeros(3, tiny_moe_config().hidden_size)
    assert layer._grouped_applies(hidden), "the grouped path must run here for this test to compare anything"
    grouped_lp, grouped_grads = run(True)
    loop_lp, loop_grads = run(False)
    assert all(torch.allclose(grouped_lp[k], loop_lp[k], atol=1e-5) for k in loop_lp)
    assert set(grouped_grads) == set(loop_grads) and len(loop_grads) == 2 * 2 * 4 * 2  # A and B, 2 layers x 4 x 2
    assert any(g.abs().sum() > 0 for n, g in loop_grads.items() if n.endswith("lora_a"))
    for name, g in loop_grads.items():
        assert torch.allclose(grouped_grads[name], g, rtol=1e-4, atol=1e-6), name


def test_the_merged_export_and_the_peft_adapter_carry_the_expert_updates(tmp_path):
    trainer = make()
    _train_b(trainer)
    plain = make(LoRASpec())
    plain.load_local_state_dict({k: v.clone() for k, v in trainer.local_state_dict().items()})
    samples = make_samples(4, seed=5)
    a, b = trainer.compute_logprobs(samples)["logprobs"], plain.compute_logprobs(samples)["logprobs"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)

    config, adapter, base, merged = exported_adapter(trainer, tmp_path)
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
    cfg = tiny_moe_config()
    assert len(adapter) == 2 * cfg.num_hidden_layers * (3 + 3 * cfg.num_experts)
    assert "base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight" in adapter
    assert_adapter_reproduces(config, adapter, base, merged)


def test_lora_builds_the_local_layer_spec_where_transformer_engine_loads(monkeypatch):
    """TE's spec fuses the input norm into q/k/v and fc1 (an adapter there would see the raw input): with LoRA
    the trainer builds megatron-core's own layers even where TE is importable."""
    from megatron_glue import model_provider

    def te_spec(config):
        raise AssertionError("the Transformer Engine spec was built")

    monkeypatch.setattr(model_provider, "transformer_engine_available", lambda: True)
    monkeypatch.setattr(model_provider, "_te_block_spec", te_spec)
    assert make().adapters
    with pytest.raises(AssertionError, match="Transformer Engine spec"):
        make(LoRASpec())


def test_an_adapter_starts_alike_in_every_layout():
    """A is drawn from the module's global name: a layer or expert keeps its A whatever stage or EP rank holds it."""
    from megatron_glue.lora import global_module_name

    trainer = make()
    model = trainer.model.module
    name = "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2"
    assert global_module_name(model, name) == name  # one process holds every layer and expert
    experts = model.decoder.layers[1].mlp  # the MoE layer numbers its experts
    monkey = list(experts.local_expert_indices)
    experts.local_expert_indices = [i + 4 for i in monkey]  # as if this rank held experts 4.. of a larger model
    model.decoder.layers[1].layer_number += 10  # and this layer were the 12th of the whole model
    try:
        assert global_module_name(model, name) == "decoder.layers.11.mlp.experts.local_experts.6.linear_fc2"
    finally:
        experts.local_expert_indices = monkey
        model.decoder.layers[1].layer_number -= 10


def _layout_worker(rank, config, hf_sd, sizes):
    """Two GRPO steps with expert adapters on one layout: the metrics and every adapter, gathered to PEFT names."""
    from megatron.core import parallel_state as mpu

    from megatron_glue.lora_export import gathered_adapter
    from megatron_glue.parallel import init_model_parallel
    from megatron_glue.sharding import shard_megatron_state
    from megatron_glue.weight_names import hf_to_megatron
    from tests.megatron_glue.test_parallel import _samples

    init_model_parallel(sizes, seed=11)
    trainer = MegatronTrainer(config, TrainerSettings(lr=1e-2, micro_batch_size=2, lora=EXPERT_SPEC), sizes)
    shard = shard_megatron_state(
        hf_to_megatron(hf_sd, config), config, tp_rank=mpu.get_tensor_model_parallel_rank(), tp_size=sizes.tp,
        ep_rank=mpu.get_expert_model_parallel_rank(), ep_size=sizes.ep, pp_rank=mpu.get_pipeline_model_parallel_rank(),
        pp_size=sizes.pp, etp_size=sizes.expert_tp)
    trainer.load_local_state_dict(dict(shard))
    samples = _samples()
    metrics = [trainer.train_step(samples, kind="grpo") for _ in range(2)]
    return {"metrics": metrics, "adapter": gathered_adapter(trainer)}


def test_expert_adapters_train_alike_on_the_30b_layout_in_miniature():
    """TP 2 x EP 2 with experts whole (expert-TP 1) and sequence parallelism, as the shipped Qwen3-30B-A3B layout:
    the same losses and gradient norms over two steps as one process, and the same adapters after them (each EP
    rank's experts gathered to rank 0 under their global numbers)."""
    from tests.distributed import run_ranks
    from tests.megatron_glue.test_parallel import _hf_weights

    config = tiny_moe_config()
    hf_sd = _hf_weights(config)
    (reference,) = run_ranks(_layout_worker, 1, config, hf_sd, ParallelSizes())
    results = run_ranks(_layout_worker, 2, config, hf_sd, ParallelSizes(tp=2, ep=2, etp=1, sequence_parallel=True))
    got = results[0]
    for step, want in zip(got["metrics"], reference["metrics"]):
        for key in ("pg_loss", "grad_norm"):
            assert step[key] == pytest.approx(want[key], rel=1e-5), key
    assert reference["metrics"][1]["grad_norm"] != pytest.approx(reference["metrics"][0]["grad_norm"], rel=1e-3)
    assert results[1]["adapter"] is None and set(got["adapter"]) == set(reference["adapter"])
    assert any(".experts.3." in k for k in got["adapter"])  # the second EP rank's experts reached rank 0
    for key, want in reference["adapter"].items():
        assert torch.allclose(got["adapter"][key], want, atol=1e-5), key
    moved = [k for k, v in reference["adapter"].items() if "lora_B" in k and ".experts." in k and v.abs().sum() > 0]
    assert moved  # the experts' adapters trained
