"""`configs/grpo_lora.yaml` end to end on the tiny job: the RL stage trains adapters only, so the final merged
weights differ from the warm start in the adapted layers (attention in and out) and nowhere else; the engines
sample with the merged weights every step (the step-0 consistency check compares them with the trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from slime_ext.studies import read_metrics
from tests.conftest import CONFIGS
from tests.e2e.test_training_job import TINY


def _weights(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_grpo_lora_job_moves_only_the_adapted_layers(tmp_path):
    from slime_ext.orchestration.driver import main

    assert main([str(CONFIGS / "grpo_lora.yaml"), f"run.output_dir={tmp_path / 'runs'}",
                 f"run.cache_dir={tmp_path / 'cache'}", *TINY, "sft.steps=3", "train.steps=2",
                 "run.stages=[data,tokenizer,sft,rl]", "train.check_consistency_at_start=true"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
    (warm,) = (tmp_path / "cache" / "warmstart").glob("*/hf")
    before, after = _weights(warm), _weights(run_dir / "hf")
    assert set(before) == set(after)
    moved = {k for k in before if not (before[k].float() == after[k].float()).all()}
    attention = ("q_proj", "k_proj", "v_proj", "o_proj")
    assert moved and all(any(f".{p}." in k for p in attention) for k in moved), sorted(moved)[:5]
    # beside the merged model, the adapter in PEFT's layout over the warm start: warm + scale B A = merged
    import json

    config = json.loads((run_dir / "hf" / "lora" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(warm) and config["r"] == 8
    adapter = load_file(run_dir / "hf" / "lora" / "adapter_model.safetensors")
    scale = config["lora_alpha"] / config["r"]
    for key in (k for k in adapter if k.endswith("lora_A.weight")):
        name = key.removeprefix("base_model.model.").replace("lora_A.weight", "weight")
        delta = scale * adapter[key.replace("lora_A", "lora_B")] @ adapter[key]
        assert (before[name].float() + delta - after[name].float()).abs().max() < 1e-5, name


# the experts' adapters in PEFT's layout: 8 experts x 2 layers, each gate, up and down A [8, 64] + B [64, 8]
EXPERT_VALUES = 8 * 2 * 3 * (8 * 64 + 64 * 8)


@pytest.mark.parametrize("engine", ["embedded", "sglang", "embedded-experts"])
def test_adapter_sync_sends_the_adapters_alone_and_the_engine_serves_the_trained_policy(tmp_path, engine):
    """train.lora.sync = adapter: each sync sends the PEFT adapter (q/k/v/o of 2 layers at rank 8, hidden 64, 4
    heads and 2 KV heads of 32: per layer q 8 x 64 + 128 x 8, k and v 8 x 64 + 64 x 8, o 8 x 128 + 64 x 8 = 5120
    fp32 values: 40960 bytes a sync; with the experts adapted `EXPERT_VALUES` more), every request names it, and
    the engine then serves what the trainer trains: its logprobs agree with the trainer's at every step (fp32
    both), as they would with merged weights."""
    from slime_ext.orchestration.driver import main

    servers = ["rollout.engine=sglang", "sglang.num_engines=1", "sglang.weight_sync=tensor",
               "cluster.colocate_sleep=false"] if engine == "sglang" else []
    experts = engine.endswith("experts")
    if experts:
        servers = ["train.lora.target_modules=[linear_qkv,linear_proj,experts]"]
    assert main([str(CONFIGS / "grpo_lora.yaml"), f"run.output_dir={tmp_path / 'runs'}",
                 f"run.cache_dir={tmp_path / 'cache'}", *TINY, "sft.steps=3", "train.steps=3",
                 "run.stages=[data,tokenizer,sft,rl]", "train.lora.sync=adapter", *servers]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["sync/bytes_sent"] == (2 * 5120 + experts * EXPERT_VALUES) * 4 for r in rows)
    assert all(r["train/mismatch/abs_diff_mean"] < 1e-4 for r in rows[1:])  # steps after a trained adapter
