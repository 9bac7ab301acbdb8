"""A tiny on-policy distillation job end to end (`configs/opd.yaml`): the teacher is the student's own SFT warm
start (a checkpoint with its vocabulary that exists before the run), loaded beside the student in the embedded
engine; the rollout manager has it score every sampled token and the trainer trains on the per-token terms."""

from __future__ import annotations

from pathlib import Path

from slime_ext.studies import read_metrics
from tests.conftest import CONFIGS
from tests.e2e.test_training_job import TINY


def warm_start_teacher(tmp_path: Path) -> tuple[Path, list[str]]:
    """The tiny job's SFT warm start, trained first (the teacher), and the arguments the OPD job shares with it."""
    from slime_ext.orchestration.driver import main

    cache = tmp_path / "cache"
    common = [f"run.cache_dir={cache}", *TINY, "sft.steps=3"]
    assert main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'sft'}", *common,
                 "run.stages=[data,tokenizer,sft]"]) == 0
    (teacher,) = sorted(Path(cache, "warmstart").glob("*/hf"))
    return teacher, common


def test_a_tiny_opd_job_scores_every_trained_token_with_the_teacher(tmp_path):
    from slime_ext.orchestration.driver import main

    teacher, common = warm_start_teacher(tmp_path)
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


def test_opd_on_engine_servers_one_step_off_policy_scores_with_the_teachers_own_server(tmp_path):
    """The cluster path: `rollout.engine: sglang`, the student on one engine server, the teacher on a scoring
    server of its own (`opd.teacher_engines`, prefill-only /generate requests), one step off-policy
    (rollout.max_staleness 1, the decoupled loss's IcePop correction): every step's tokens are scored, the
    first step's teacher (= the warm start) agrees with the student, and the teacher's server has its own log."""
    from slime_ext.orchestration.driver import main

    teacher, common = warm_start_teacher(tmp_path)
    assert main([str(CONFIGS / "opd.yaml"), f"run.output_dir={tmp_path / 'runs'}", *common, "train.steps=3",
                 "run.stages=[data,tokenizer,sft,rl]", f"opd.teacher={teacher}", "rollout.engine=sglang",
                 "sglang.num_engines=1", "rollout.max_staleness=1", "grpo.mismatch.mode=mask"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["opd/scored_tokens"] > 0 and r["time/score"] > 0 for r in rows)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]  # step t trains version max(0, t - 1)
    # step 0: student = warm start = teacher (engine server fp32 vs the teacher's server fp32)
    assert abs(rows[0]["opd/reverse_kl"]) < 1e-4
    assert (run_dir / "scoring_logs" / "engine_0.log").stat().st_size > 0
    assert (run_dir / "engine_logs" / "engine_0.log").exists()
