"""LoRA in the trainer (`train.lora`): only the adapters train and hold optimizer state, the base weights do not
move, the state the export and the engines read is the merged model under the names of a model without adapters,
a checkpoint resumes exactly, and a new adapter changes nothing until it trains."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from megatron_glue.lora import LoRASpec
from megatron_glue.model_provider import ParallelSizes
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.trainer_checkpoint import load_checkpoint, save_checkpoint
from tests.megatron_fixtures import single_process_parallel_state, tiny_dense_config
from tests.megatron_glue.test_trainer import make_samples

SPEC = LoRASpec(rank=4, alpha=8.0)


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    single_process_parallel_state(seed=3)


def make(lora: LoRASpec = SPEC, hf_config: Any = None, **kw) -> MegatronTrainer:
    """A one-process trainer with `lora` on `hf_config` (default: the tiny dense model)."""
    torch.manual_seed(0)
    settings = TrainerSettings(**({"lr": 1e-2, "micro_batch_size": 3, "clip_grad": 0.0, "lora": lora} | kw))
    return MegatronTrainer(hf_config or tiny_dense_config(), settings, ParallelSizes())


def test_only_the_adapters_train_and_hold_optimizer_state():
    trainer = make()
    layers = tiny_dense_config().num_hidden_layers
    assert len(trainer.adapters) == 4 * layers  # q/k/v, attention out, fc1, fc2 of every layer
    before = {k: v.clone() for k, v in trainer.raw_state_dict().items()}
    trainable = [n for n, p in trainer.model.module.named_parameters() if p.requires_grad]
    assert trainable and all(n.rpartition(".")[2] in ("lora_a", "lora_b") for n in trainable)
    assert len(trainable) == 2 * len(trainer.adapters)
    for _ in range(2):
        trainer.train_step(make_samples(6), kind="sft")
    after = trainer.raw_state_dict()
    moved = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert moved and all(k.rpartition(".")[2] in ("lora_a", "lora_b") for k in moved)
    assert any(k.endswith("lora_b") for k in moved)  # B left zero
    # the optimizer holds state for the adapters only (Adam's two moments per adapter tensor)
    optimizer_params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(optimizer_params) == len(trainable)
    n_adapter = sum(p.numel() for n, p in trainer.model.module.named_parameters() if p.requires_grad)
    assert sum(p.numel() for p in optimizer_params) == n_adapter


def test_the_exported_state_is_the_merged_model_under_plain_names():
    plain, adapted = make(LoRASpec()), make()
    assert set(adapted.local_state_dict()) == set(plain.local_state_dict())
    assert all(torch.equal(v, plain.local_state_dict()[k]) for k, v in adapted.local_state_dict().items())  # B = 0
    adapted.train_step(make_samples(6), kind="sft")
    state = adapted.local_state_dict()
    for prefix, adapter in adapted.adapters.items():
        merged = adapter.base.weight + adapter.scaling * adapter.lora_b @ adapter.lora_a
        assert torch.allclose(state[f"{prefix}.weight"], merged)
    # the merged model's logprobs are the adapted model's: load the export into a trainer without adapters
    plain.load_local_state_dict({k: v.clone() for k, v in state.items()})
    samples = make_samples(4, seed=5)
    a = adapted.compute_logprobs(samples)["logprobs"]
    b = plain.compute_logprobs(samples)["logprobs"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # weights from an HF checkpoint (plain names) load into the frozen base; the adapters keep their values
    kept = {k: v.clone() for k, v in adapted.raw_state_dict().items() if "lora_" in k}
    adapted.load_local_state_dict(make(LoRASpec()).local_state_dict())
    assert all(torch.equal(adapted.raw_state_dict()[k], v) for k, v in kept.items())


def test_checkpoint_resume_with_adapters_is_exact(tmp_path):
    trainer = make()
    samples = make_samples(6)
    trainer.train_step(samples, kind="sft")
    save_checkpoint(trainer, tmp_path)
    continued = [trainer.train_step(samples, kind="sft")["nll"] for _ in range(2)]
    resumed = make()
    load_checkpoint(resumed, tmp_path)
    assert [resumed.train_step(samples, kind="sft")["nll"] for _ in range(2)] == continued


def test_bad_targets_are_refused():
    with pytest.raises(ValueError, match="no such linear layer"):
        make(LoRASpec(rank=4, target_modules=("linear_nothing",)))


def exported_adapter(trainer: MegatronTrainer, folder) -> tuple[dict, dict, dict, dict]:
    """(adapter_config.json, adapter tensors) as written to `folder`, and the HF weights merged and without the
    adapters (every B zeroed afterwards)."""
    import json

    from safetensors.torch import load_file

    from megatron_glue.lora_export import write_peft_adapter
    from megatron_glue.weight_export import export_hf_state_dict

    write_peft_adapter(trainer, folder, base_model="warm")
    merged = export_hf_state_dict(trainer)
    with torch.no_grad():
        for adapter in trainer.adapters.values():
            adapter.lora_b.zero_()
    base = export_hf_state_dict(trainer)
    return json.loads((folder / "adapter_config.json").read_text()), load_file(folder / "adapter_model.safetensors"), \
        base, merged


def assert_adapter_reproduces(config: dict, adapter: dict, base: dict, merged: dict) -> None:
    """Per HF module, base + (lora_alpha / r) lora_B @ lora_A is the merged weight, and not the base."""
    scale = config["lora_alpha"] / config["r"]
    for key in (k for k in adapter if k.endswith("lora_A.weight")):
        module = key.removesuffix(".lora_A.weight").removeprefix("base_model.model.")
        update = adapter[key.replace("lora_A", "lora_B")] @ adapter[key]
        assert torch.allclose(base[f"{module}.weight"] + scale * update, merged[f"{module}.weight"], atol=1e-6), module
        assert not torch.equal(base[f"{module}.weight"], merged[f"{module}.weight"]), module


def test_the_peft_adapter_reproduces_the_merged_hf_weights(tmp_path):
    """adapter_model.safetensors in PEFT's layout: per HF module (q/k/v cut from the fused qkv, gate/up from fc1),
    base weight + (lora_alpha / r) lora_B @ lora_A equals the merged model's weight."""
    trainer = make()
    trainer.train_step(make_samples(6), kind="sft")
    config, adapter, base, merged = exported_adapter(trainer, tmp_path)
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert len(adapter) == 2 * 7 * tiny_dense_config().num_hidden_layers
    assert_adapter_reproduces(config, adapter, base, merged)
