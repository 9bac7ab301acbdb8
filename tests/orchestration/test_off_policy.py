"""One-step off-policy RL (`rollout.off_policy_steps: 1`) through the real loop (`TrainingJob._rl_loop`,
`_rl_step`) and the real rollout manager (in the driver), with a fake engine whose tokens are a function of
the request seed and a fake trainer whose step sleeps (the planted delay). No Ray, no model.

What a wrong implementation fails: rollout t+1 must start generating before train step t ends; every
token trained at step t must be of version t - 1 (t >= 1; exactly 1 behind without partial rollouts);
partial rollouts must cut each response at the sync (versions v then v + 1, continuation = prompt +
partial response) and `mask` / `correct` must zero / keep the old tokens; a resume must train the same
batches on the same prompts as the uninterrupted run.
"""

from __future__ import annotations

import json
import re
import pickle
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from slime_ext.config import load_config
from slime_ext.data.generation import GenerateResult
from slime_ext.engine.failures import StaleRollout
from slime_ext.orchestration import training_job
from slime_ext.orchestration.off_policy import PENDING_KEY, OffPolicyRollouts
from slime_ext.orchestration.rollout_manager import RolloutManager, continuation_seed
from slime_ext.orchestration.training_job import TrainingJob
from tests.conftest import CONFIGS

PROMPT_LEN, MAX_NEW, HOLD = 2, 8, 3
ROWS = [{"prompt": f"q{i}", "label": "7", "row_id": i} for i in range(40)]


class Tokenizer:
    eos_token_id = 1

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3, 100 + int(re.search(r"q(\d+)", text).group(1))]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def step_of(rid: str) -> int:
    return int(rid.split("-")[0][1:])


class FakeEngine:
    """Emits MAX_NEW tokens per request (finish "length"), one position per `tick` seconds for the whole
    batch, each a function of (seed, position); logprob -(version + 1) / 10 marks the version that produced
    it. With `hold`, the first round of a rollout of step >= 1 stops after HOLD tokens and waits for an
    abort (a weight sync must come while it is in flight). Thread-safe `abort`, like the embedded engine."""

    def __init__(self, tick: float = 0.0, hold: bool = False):
        self.tick, self.hold = tick, hold
        self.version = 0
        self.versions: list[int] = []
        self.requests: list = []
        self.started: dict[int, float] = {}  # rollout step -> when its first generate call began
        self._aborted: set[str] = set()
        self._lock = threading.Lock()

    def abort(self, rid: str) -> None:
        with self._lock:
            self._aborted.add(rid)

    def sync_weights(self, source: Any, version: int) -> dict:
        self.version = int(version)
        self.versions.append(int(version))
        return {}

    def generate(self, requests: list) -> list:
        step = step_of(requests[0].rid)
        self.started.setdefault(step, time.time())
        self.requests += requests
        version = self.version
        out = {q.rid: [] for q in requests}
        done: dict[str, str] = {}
        first_round = all(len(q.input_ids) == PROMPT_LEN for q in requests)
        deadline = time.time() + 10
        while len(done) < len(requests):
            for q in requests:
                if q.rid in done:
                    continue
                held = self.hold and first_round and step >= 1
                with self._lock:  # a held request sees an abort only once it has its HOLD tokens
                    if q.rid in self._aborted and not (held and len(out[q.rid]) < HOLD):
                        done[q.rid] = "abort"
                        continue
                if held and len(out[q.rid]) == HOLD:
                    if time.time() > deadline:
                        done[q.rid] = "stop"  # no sync came: the test's assertions fail, nothing hangs
                    continue
                made = len(q.input_ids) - PROMPT_LEN + len(out[q.rid])
                out[q.rid].append(10 + (q.seed + 7 * made) % 50)
                if len(out[q.rid]) == q.sampling.max_new_tokens:
                    done[q.rid] = "length"
            time.sleep(self.tick or 0.001)
        with self._lock:
            self._aborted.difference_update(out)
        return [GenerateResult(q.rid, out[q.rid], [-(version + 1) / 10] * len(out[q.rid]), done[q.rid],
                               [{} for _ in out[q.rid]], 0, len(q.input_ids)) for q in requests]


class FakeGroup:
    """The trainer: train_step sleeps `delay` and records what it trained; checkpoints pickle `extra`."""

    def __init__(self, delay: float = 0.0, step: int = 0):
        self.delay, self.step = delay, step
        self.trained: dict[int, list] = {}
        self.train_times: dict[int, tuple[float, float]] = {}

    def first(self, method: str, *args: Any) -> Any:
        if method == "load":
            directory = Path(args[0])
            it = (directory / "latest").read_text().strip()
            self.step = int(it.split("_")[1])
            return pickle.loads((directory / it / "rank_00000.pt").read_bytes())
        assert method == "train_step"
        t0 = time.time()
        time.sleep(self.delay)
        self.trained[self.step] = [(s.sample_id, s.metadata["row_id"], list(s.response_ids), s.token_versions,
                                    list(s.loss_mask), list(s.logprobs)) for s in args[0]]
        self.train_times[self.step] = (t0, time.time())
        self.step += 1
        return {"pg_loss": 0.1}

    def call(self, method: str, directory: str, extra: dict) -> list:
        assert method == "save"
        it_dir = Path(directory) / f"iter_{self.step:07d}"
        it_dir.mkdir(parents=True, exist_ok=True)
        (it_dir / "rank_00000.pt").write_bytes(pickle.dumps(extra))
        (Path(directory) / "latest").write_text(it_dir.name + "\n")
        return [str(it_dir)]

    def push_weights(self, target: Any, version: Any = None, expect_version: Any = None) -> list:
        return []


def config(*overrides: str):
    base = ["rollout.manager=driver", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
            f"rollout.max_response_len={MAX_NEW}", "run.save_every=1",
            "train.check_consistency_at_start=false"]  # the fake trainer has no logprobs to compare
    return load_config(CONFIGS / "grpo.yaml", base + list(overrides)).config


def job_for(cfg, run_dir: Path) -> TrainingJob:
    job = TrainingJob.__new__(TrainingJob)  # the loop's collaborators only
    job.cfg, job.run_dir, job.kl_active, job.peak_gib = cfg, run_dir, False, None
    job.method_name = "grpo"  # the method itself is the manager's during RL
    return job


def manager_for(cfg, engine: FakeEngine) -> Any:
    manager = RolloutManager(cfg, ROWS, Tokenizer(), engine)
    if cfg.rollout.off_policy_steps:
        return OffPolicyRollouts(manager, engine, cfg.train.steps, cfg.rollout.partial_rollouts)
    return manager


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def fixed_rss(monkeypatch):
    monkeypatch.setattr(training_job, "_peak_rss_gib", lambda: 1.0)


def run(tmp_path: Path, *overrides: str, steps: int = 4, delay: float = 0.0, tick: float = 0.0,
        hold: bool = False) -> tuple[FakeEngine, FakeGroup, list[dict]]:
    cfg = config(f"train.steps={steps}", *overrides)
    engine, group = FakeEngine(tick, hold), FakeGroup(delay)
    job_for(cfg, tmp_path)._rl_loop(0, manager_for(cfg, engine), group, engine, tmp_path / "checkpoints")
    return engine, group, metrics(tmp_path)


def test_rollout_t_plus_1_overlaps_train_t_and_is_exactly_one_version_stale(tmp_path):
    # train steps take 0.4 s, a rollout 8 ticks of 0.02 s: rollout t+1 fits inside train t
    engine, group, rows = run(tmp_path, "rollout.off_policy_steps=1", delay=0.4, tick=0.02)
    assert engine.versions == [1, 2, 3, 4]
    for t in range(3):  # rollout t+1 started generating before train step t ended (and after it began)
        assert group.train_times[t][0] - 0.05 < engine.started[t + 1] < group.train_times[t][1]
    for t, trained in group.trained.items():
        assert len(trained) == 4 and all(len(ids) == MAX_NEW for _, _, ids, *_ in trained)
        # step 0's rollout is generated before anything trains (version 0); every later one with version t-1
        assert all(versions == [max(t - 1, 0)] * MAX_NEW for *_, versions, _, _ in trained)
        assert all(lps == [-(max(t - 1, 0) + 1) / 10] * MAX_NEW for *_, lps in trained)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/partial_aborted"] for r in rows] == [0.0] * 4
    assert all(r["time/overlap"] > 0.1 for r in rows[:3]) and rows[3]["time/overlap"] == 0.0
    assert all(r["time/overlap"] <= r["time/train"] + 0.05 for r in rows)
    assert not any(k.startswith("_") for r in rows for k in r)


def test_off_policy_trains_the_same_prompts_and_responses_as_on_policy(tmp_path):
    """Only the weights behind the tokens differ: the same prompts per step, the same seeds (the fake
    engine's tokens are a function of them), and the on-policy run keeps its metrics and no versions."""
    _, on, on_rows = run(tmp_path / "on")
    _, off, _ = run(tmp_path / "off", "rollout.off_policy_steps=1")
    assert {t: [x[:3] for x in b] for t, b in on.trained.items()} == {t: [x[:3] for x in b] for t, b in off.trained.items()}
    assert all(versions is None for b in on.trained.values() for *_, versions, _, _ in b)
    assert not any(k.startswith(("rollout/staleness", "rollout/partial", "time/overlap")) for r in on_rows for k in r)


@pytest.mark.parametrize("stale", ["mask", "correct"])
def test_partial_rollouts_abort_at_the_sync_and_continue_with_the_new_version(tmp_path, stale):
    engine, group, rows = run(tmp_path, "rollout.off_policy_steps=1", "rollout.partial_rollouts=true",
                              f"rollout.stale_tokens={stale}", hold=True)
    assert engine.versions == [1, 2, 3, 4]
    for t in range(1, 4):  # rollout t: HOLD tokens of version t-1, aborted by the sync, the rest of version t
        for _, _, ids, versions, mask, lps in group.trained[t]:
            assert versions == [t - 1] * HOLD + [t] * (MAX_NEW - HOLD)
            assert lps == [-t / 10] * HOLD + [-(t + 1) / 10] * (MAX_NEW - HOLD)  # the engine's, kept
            assert mask == ([0.0] * HOLD if stale == "mask" else [1.0] * HOLD) + [1.0] * (MAX_NEW - HOLD)
        # the continuation: same rid, prompt + partial response as input, the rest of the budget, derived seed
        firsts = {q.rid: q for q in engine.requests if step_of(q.rid) == t and len(q.input_ids) == PROMPT_LEN}
        conts = [q for q in engine.requests if step_of(q.rid) == t and len(q.input_ids) > PROMPT_LEN]
        assert sorted(q.rid for q in conts) == sorted(firsts) and len(conts) == 4
        trained_ids = {sid: ids for sid, _, ids, *_ in group.trained[t]}
        for q in conts:
            assert q.input_ids == firsts[q.rid].input_ids + trained_ids[q.rid][:HOLD]
            assert q.sampling.max_new_tokens == MAX_NEW - HOLD and q.seed == continuation_seed(firsts[q.rid].seed, HOLD)
    assert [r["rollout/partial_aborted"] for r in rows] == [0.0, 4.0, 4.0, 4.0]
    if stale == "mask":  # only the newest version's tokens train: nothing stale is trained
        assert [r["rollout/staleness_max"] for r in rows] == [0.0] * 4
        assert [r["rollout/stale_tokens_masked"] for r in rows] == [0.0] + [4.0 * HOLD] * 3
    else:
        assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
        assert [r["rollout/staleness_mean"] for r in rows] == [0.0] + [HOLD / MAX_NEW] * 3
        assert [r["rollout/stale_tokens_masked"] for r in rows] == [0.0] * 4


def test_resume_trains_the_saved_pending_rollout_and_skips_no_prompt(tmp_path, monkeypatch):
    monkeypatch.setattr(training_job, "_prune_checkpoints", lambda directory: None)  # keep iter 2 to resume from
    _, whole, _ = run(tmp_path / "whole", "rollout.off_policy_steps=1", steps=5)
    first = tmp_path / "cut"
    _, cut, _ = run(first, "rollout.off_policy_steps=1", steps=5)
    ckpt = first / "checkpoints"
    saved = pickle.loads((ckpt / "iter_0000002" / "rank_00000.pt").read_bytes())
    assert saved["step"] == 2 and saved["manager"][PENDING_KEY]["step"] == 2  # rollout 2, collected during step 1
    (ckpt / "latest").write_text("iter_0000002\n")  # killed after step 3's row: resume from step 2
    cfg = config("train.steps=5", "rollout.off_policy_steps=1")
    engine, group = FakeEngine(), FakeGroup()
    job, manager = job_for(cfg, first), manager_for(cfg, engine)
    start = job._resume(group, manager, engine, ckpt)
    assert start == 2 and [r["step"] for r in metrics(first)] == [0, 1]
    job._rl_loop(start, manager, group, engine, ckpt)
    assert engine.versions == [2, 3, 4, 5]  # restored weights as version 2, then each step's sync
    # step 2 trains the saved rollout (version 1, not regenerated), then the same batches as the whole run
    assert not any(step_of(q.rid) == 2 for q in engine.requests)
    assert {t: whole.trained[t] for t in (2, 3, 4)} == group.trained
    rows_seen = [x[1] for t in range(5) for x in (cut.trained[t] if t < 2 else group.trained[t])]
    assert rows_seen == [x[1] for t in range(5) for x in whole.trained[t]]
    assert [r["step"] for r in metrics(first)] == [0, 1, 2, 3, 4]


def test_resume_from_a_checkpoint_without_a_pending_rollout_regenerates_it(tmp_path):
    """An on-policy run's checkpoint, resumed with off_policy_steps 1: rollout 2 is generated at the resume
    (with the restored weights, version 2) from the saved data offset."""
    _, on, _ = run(tmp_path, steps=2)
    cfg = config("train.steps=4", "rollout.off_policy_steps=1")
    engine, group = FakeEngine(), FakeGroup()
    job, manager = job_for(cfg, tmp_path), manager_for(cfg, engine)
    start = job._resume(group, manager, engine, tmp_path / "checkpoints")
    job._rl_loop(start, manager, group, engine, tmp_path / "checkpoints")
    assert start == 2 and sorted(group.trained) == [2, 3]
    assert all(v == [2] * MAX_NEW for *_, v, _, _ in group.trained[2])  # generated now: version 2, staleness 0
    assert all(v == [2] * MAX_NEW for *_, v, _, _ in group.trained[3])  # generated beside step 2
    seen = [x[1] for t in (0, 1) for x in on.trained[t]] + [x[1] for t in (2, 3) for x in group.trained[t]]
    assert len(seen) == 16 and len(set(seen)) == 8  # two prompts x two samples a step, each prompt once


def test_tokens_outside_the_version_window_are_a_stale_rollout():
    cfg = config("train.steps=4", "rollout.off_policy_steps=1")
    engine = FakeEngine()
    manager = RolloutManager(cfg, ROWS, Tokenizer(), engine)
    manager.rollout(3, weight_version=2)  # one behind: fine
    with pytest.raises(StaleRollout, match=r"step 4: 4 rollout\(s\) hold tokens of weight versions outside \[3, 4\]"):
        manager.rollout(4, weight_version=2)  # two behind: an engine missed a sync


def test_a_continued_request_keeps_its_flags_and_the_last_calls_routing():
    """Partial rollouts with routing replay: the continuation asks for routed experts again, and the merged
    result carries the continuation's routing, which covers the prompt and every earlier output token."""
    import torch

    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest, GenerateResult
    from slime_ext.orchestration.rollout_manager import _Partial

    q = GenerateRequest("r0", [5, 6, 7], SamplingParams(max_new_tokens=8), seed=3, return_routed_experts=True)
    p = _Partial(q)
    first = torch.zeros(3 + 2 - 1, 2, 2, dtype=torch.int16)
    p.add(GenerateResult("r0", [8, 9], [-1.0, -1.0], "abort", [{}, {}], 0, 3, routed_experts=first), 4)
    follow = p.continuation()
    assert follow.return_routed_experts and follow.input_ids == [5, 6, 7, 8, 9]
    assert follow.sampling.max_new_tokens == 6 and follow.rid == "r0" and follow.seed != q.seed
    second = torch.ones(5 + 3 - 1, 2, 2, dtype=torch.int16)
    p.add(GenerateResult("r0", [10, 11, 1], [-1.0] * 3, "stop", [{}] * 3, 5, 5, routed_experts=second), 5)
    merged = p.result()
    assert merged.output_ids == [8, 9, 10, 11, 1] and p.versions == [4, 4, 5, 5, 5]
    assert merged.routed_experts is second and merged.routed_experts.shape[0] == 3 + 5 - 1
