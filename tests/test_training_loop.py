"""The training loop through the full stack (Ray actors, Megatron trainer, embedded engine).

These runs use a tiny configuration so they take tens of seconds; the default job's numbers are in the
README (a ~20-minute run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO

TINY = [
    "data.synthetic.n_train=400", "data.synthetic.n_eval=16", "tokenizer.n_training_texts=400",
    "model.hidden_size=64", "model.num_layers=2", "model.moe_intermediate_size=64", "model.intermediate_size=128",
    "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=8", "rollout.max_response_len=24",
    "train.micro_batch_size=16", "eval.n_prompts=8", "eval.n_samples=2", "eval.k=[1,2]",
]


def job_args(tmp: Path, *extra: str) -> list[str]:
    return [str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp / 'runs'}", f"run.cache_dir={tmp / 'cache'}", *TINY, *extra]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)
def test_positive_control_first_token_reward_rises(tmp_path, monkeypatch):
    """A trivially learnable reward (the first response token has an even id) must go up under GRPO.

    Separates a broken loop (signs, masks, weight sync) from a task too hard for the model."""
    from slime_ext.main import main
    from slime_ext.methods.grpo import GRPO
    from slime_ext.rewards import ReasonCounter

    def first_token_even(self, groups):
        for group in groups:
            for s in group:
                s.reward = float(bool(s.response_ids) and s.response_ids[0] % 2 == 0)
        return ReasonCounter()

    monkeypatch.setattr(GRPO, "score", first_token_even)
    # 128 two-token rollouts per step from a random init: the first token's parity is the whole signal
    rc = main(job_args(tmp_path, "sft.steps=0", "train.steps=10", "train.lr=1e-2", "run.stages=[data,tokenizer,rl]",
                       "run.save_every=100", "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=16",
                       "rollout.max_response_len=2"))
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rewards = [m["reward/mean"] for m in read_metrics(run_dir)]
    assert len(rewards) == 10
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.2, rewards
    assert all(0 < m["time/sync"] < m["time/step"] for m in read_metrics(run_dir))


def _run_cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slime_ext.main", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_run_resumes_and_continues_the_metrics(tmp_path):
    env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    common = ["sft.steps=4", "train.steps=6", "run.stages=[data,tokenizer,sft,rl]"]
    reference = _run_cli(job_args(tmp_path / "ref", *common), env)
    assert reference.wait(timeout=900) == 0, reference.stderr.read()[-3000:]
    (ref_dir,) = (tmp_path / "ref" / "runs").iterdir()

    victim = _run_cli(job_args(tmp_path / "kill", *common), env)
    runs = tmp_path / "kill" / "runs"
    deadline = time.time() + 600
    while time.time() < deadline:
        dirs = list(runs.glob("*/metrics.jsonl")) if runs.exists() else []
        if dirs and len(dirs[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.5)
    os.killpg(victim.pid, signal.SIGKILL)  # the driver and every Ray process it started
    victim.wait(timeout=60)
    (run_dir,) = runs.iterdir()
    resumed = _run_cli([f"resume={run_dir}"], env)
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()[-3000:]
    got, want = read_metrics(run_dir), read_metrics(ref_dir)
    assert [m["step"] for m in got] == list(range(6))
    for a, b in zip(got, want):  # same data order, RNG, optimizer and weights: the same numbers
        assert a["reward/mean"] == b["reward/mean"] and a["response_len/mean"] == b["response_len/mean"]
        assert a["train/pg_loss"] == pytest.approx(b["train/pg_loss"], rel=1e-4, abs=1e-7)


def test_missing_model_path_is_a_clear_error(tmp_path, capsys):
    from slime_ext.main import main

    with pytest.raises(FileNotFoundError, match="model.hf_path=/nonexistent/ckpt: no config.json"):
        main(job_args(tmp_path, "model.hf_path=/nonexistent/ckpt", "run.stages=[data,tokenizer,sft]"))


def test_unimplemented_method_stops_before_training_and_says_so(tmp_path):
    from slime_ext.main import main

    rc = main([str(CONFIGS / "tandem.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'c'}",
               *TINY, "run.stages=[data,tokenizer,sft,rl]"])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["not_implemented_stages"] == ["sft", "rl"] and summary["complete"] is False
    assert not (run_dir / "metrics.jsonl").exists()
