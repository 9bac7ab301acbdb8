"""A multi-turn run resumed mid-way continues bit-identically: the scripted environment's episodes
(observations in every step) for 3 RL steps straight through, and again stopped right after the first
checkpoint (Ctrl-C's path: KeyboardInterrupt after the save) and resumed with `resume=RUN_DIR`. The resumed
run's rows of steps 1 and 2 equal the uninterrupted run's in every key but timing, throughput and memory,
the `env/*` metrics included; and the resumed run trains steps 1 and 2 only (a restart at step 0 fails)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from slime_ext.envs import registry
from slime_ext.methods.grpo import method as grpo_method
from slime_ext.orchestration import training_job
from slime_ext.rewards import get_verifier
from tests.conftest import CONFIGS
from tests.doc_examples import tiny_job

STEPS = 3
JOB = [*tiny_job(n_samples=4, max_response_len=64), "rollout.manager=driver", "rollout.env=scripted",
       "rollout.max_turns=3", "rollout.max_turn_tokens=12", f"train.steps={STEPS}", "run.save_every=1"]
VOLATILE = re.compile(r"^(time|perf)/|per_s|seconds|rss|growth")  # measured, not computed: differ run to run


def _graded(name: str):
    """The verifier's result with a score graded by the response's length: the tiny model never answers, and
    with all-zero rewards nothing would train, so a resume that lost the weights or the optimizer would pass."""
    verify = get_verifier(name)
    return lambda response, label: dataclasses.replace(verify(response, label), score=(len(response) % 7) / 6)


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _computed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not VOLATILE.search(k)}


@pytest.mark.slow  # ~60 s; the resume logic has fast tests (tests/orchestration/test_resume.py)
@pytest.mark.timeout(900)
def test_a_multi_turn_run_resumed_after_its_first_checkpoint_continues_bit_identically(tmp_path, monkeypatch):
    from slime_ext.orchestration.driver import main

    monkeypatch.setitem(registry.ENVS, "scripted", registry.EnvEntry("tests.envs.conftest:ScriptedEnv"))
    monkeypatch.setattr(grpo_method, "get_verifier", _graded)  # rollout.manager=driver: scored in this process
    cache = f"run.cache_dir={tmp_path / 'cache'}"  # shared: the second job reuses the data, tokenizer, warm start
    assert main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'ref'}", cache, *JOB]) == 0
    (ref_dir,) = (tmp_path / "ref").iterdir()
    want = _rows(ref_dir)
    assert [r["step"] for r in want] == list(range(STEPS))
    for r in want:  # multi-turn episodes with observations in every step
        assert r["env/turns_mean"] > 1.5 and r["env/observation_tokens_mean"] > 5, r
        assert r["train/grad_norm"] > 0 and r["reward/all_wrong_groups"] < 1, r  # the steps train: the weights move

    prune = training_job._prune_checkpoints

    def stop_after_first_checkpoint(directory, *args, **kwargs):
        prune(directory, *args, **kwargs)
        raise KeyboardInterrupt  # after step 0's checkpoint is complete, before step 1 starts

    monkeypatch.setattr(training_job, "_prune_checkpoints", stop_after_first_checkpoint)
    assert main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'cut'}", cache, *JOB]) == 130
    (run_dir,) = (tmp_path / "cut").iterdir()
    before = _rows(run_dir)
    assert [r["step"] for r in before] == [0]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_0000001"
    monkeypatch.setattr(training_job, "_prune_checkpoints", prune)

    trained: list[int] = []
    rl_step = training_job.TrainingJob._rl_step

    def recording(self, step, *args, **kwargs):
        trained.append(step)
        return rl_step(self, step, *args, **kwargs)

    monkeypatch.setattr(training_job.TrainingJob, "_rl_step", recording)
    assert main([f"resume={run_dir}"]) == 0
    got = _rows(run_dir)
    assert trained == [1, 2], trained  # resumed at step 1, not re-run from step 0
    assert [r["step"] for r in got] == list(range(STEPS))
    assert got[0] == before[0]  # step 0's row is the interrupted run's own (timings included), kept
    for a, b in zip(got[1:], want[1:]):
        a, b = _computed(a), _computed(b)
        assert any(k.startswith("env/") for k in a) and a.keys() == b.keys()
        assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
