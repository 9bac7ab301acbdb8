"""A tiny on-policy distillation job end to end (`configs/opd.yaml`): the teacher is the student's own SFT warm
start (a checkpoint with its vocabulary that exists before the run), loaded beside the student in the embedded
engine; the rollout manager has it score every sampled token and the trainer trains on the per-token terms."""

from __future__ import annotations

from pathlib import Path

from slime_ext.studies import read_metrics
from tests.conftest import CONFIGS
from tests.e2e.test_training_job import TINY


def test_a_tiny_opd_job_scores_every_trained_token_with_the_teacher(tmp_path):
    from slime_ext.orchestration.driver import main

    cache = tmp_path / "cache"
    common = [f"run.cache_dir={cache}", *TINY, "sft.steps=3"]
    assert main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'sft'}", *common,
                 "run.stages=[data,tokenizer,sft]"]) == 0
    (teacher,) = sorted(Path(cache, "warmstart").glob("*/hf"))
    assert main([str(CONFIGS / "opd.yaml"), f"run.output_dir={tmp_path / 'runs'}", *common, "train.steps=2",
                 "run.stages=[data,tokenizer,sft,rl]", f"opd.teacher={teacher}"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    # every trained token scored; at step 0 the student is the teacher, so their logprobs agree (engine vs HF
    # forward, both fp32) and the per-token terms are ~0
    assert all(r["opd/scored_tokens"] > 0 for r in rows)
    assert abs(rows[0]["opd/reverse_kl"]) < 1e-4
    assert (run_dir / "hf" / "config.json").exists()
