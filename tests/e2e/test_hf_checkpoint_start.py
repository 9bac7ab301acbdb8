"""RL from an HF checkpoint (the cluster path): tokenizer and architecture from `model.hf_path`, JSONL math
data in the chat template, `run.stages: [rl, eval]` (no SFT), through the whole stack (Ray actors,
Megatron trainer loading the HF weights at setup, embedded engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slime_ext.studies import read_metrics
from tests.conftest import CONFIGS
from tests.e2e.hf_checkpoint import make_tiny_hf_checkpoint, read_hf_weights, write_math_data

LR = 1e-3
STEPS = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-moe-hf"))


def hf_start_args(tmp: Path, ckpt: Path, *extra: str) -> list[str]:
    """grpo.yaml (whose model fragment is the embedded default: hidden 128, 4 layers) started from `ckpt`."""
    train, evals = write_math_data(tmp / "data")
    return [str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp / 'runs'}", f"run.cache_dir={tmp / 'cache'}",
            f"model.hf_path={ckpt}", f"tokenizer.path={ckpt}", "data.source=jsonl", f"data.train_path={train}",
            f"data.eval_path={evals}", "data.template=qwen_chat", "run.stages=[rl,eval]", f"train.steps={STEPS}",
            f"train.lr={LR}", "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=4",
            "rollout.max_response_len=16", "train.micro_batch_size=16", "eval.n_prompts=4", "eval.n_samples=2",
            "eval.k=[1,2]", *extra]


@pytest.mark.slow  # so is the launcher run from the checkpoint (tests/e2e/test_launcher_cpu.py); fast: its plan and weight names
@pytest.mark.timeout(600)
def test_rl_and_eval_start_from_the_hf_checkpoint(tmp_path, checkpoint):
    from slime_ext.orchestration.driver import main

    assert main(hf_start_args(tmp_path, checkpoint)) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True and list(summary["stages"]) == ["data", "tokenizer", "rl", "eval"]
    assert summary["stages"]["tokenizer"]["path"] == str(checkpoint)
    assert not (tmp_path / "cache" / "warmstart").exists()  # no SFT: sft.steps stays 700, but no sft stage

    # the architecture came from config.json; the YAML's model fields that differ are named, not used
    ignored = summary["model_checkpoint"]["ignored_model_keys"]
    assert ignored["hidden_size"] == {"config": 128, "checkpoint": 64, "set_by": "configs/models/tiny-qwen3-moe.yaml"}
    assert {"num_layers", "num_experts", "moe_intermediate_size"} <= set(ignored)
    final = json.loads((run_dir / "hf" / "config.json").read_text())
    assert (final["hidden_size"], final["num_hidden_layers"], final["vocab_size"]) == (64, 2, 320)

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(STEPS))
    for m in metrics:  # rewards of the 4 x 4 rollouts of each step
        assert 0.0 <= m["reward/mean"] <= 1.0 and (m["reward/mean"] * 16) == pytest.approx(round(m["reward/mean"] * 16))
    # Step 0: the trainer's logprobs of the engine's rollouts (engine = the checkpoint) match the engine's
    # own. The checkpoint's wide init makes any other weights disagree by orders of magnitude more.
    assert metrics[0]["train/approx_kl_old"] < 1e-5

    # The trained weights are the checkpoint's plus two Adam steps (each moves a weight by at most ~lr),
    # not a fresh initialisation; and they did move.
    start, end = read_hf_weights(checkpoint), read_hf_weights(run_dir / "hf")
    assert set(start) == set(end) and all(start[k].shape == end[k].shape for k in start)
    moved = max(float((end[k] - start[k]).abs().max()) for k in start)
    assert 0 < moved <= STEPS * LR * 1.1, moved

    for name in ("eval_warm_start.json", "eval_final.json", "final_table.md"):
        assert (run_dir / name).stat().st_size > 0, name
    assert json.loads((run_dir / "eval_final.json").read_text())["n_prompts"] == 4


def test_a_tokenizer_larger_than_the_checkpoint_vocabulary_is_refused(tmp_path, checkpoint, capsys):
    """The check runs before any Ray actor starts; the message names both keys."""
    from slime_ext.orchestration.driver import main

    small = tmp_path / "small-vocab"
    shutil.copytree(checkpoint, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps(config | {"vocab_size": 128}))
    assert main(hf_start_args(tmp_path, small)) == 1
    err = capsys.readouterr().err
    assert f"tokenizer.path={small}" in err and "vocab_size=128" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
