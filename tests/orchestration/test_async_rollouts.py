"""Asynchronous RL (`rollout.max_staleness: K`) through the real loop (`TrainingJob._rl_loop`, `_rl_step`)
and the real rollout manager (in the driver), with a fake engine whose tokens are a function of the request
seed and a fake trainer whose step sleeps (the planted delay). No Ray, no model.

What a wrong implementation fails: rollout t+1 must start generating before train step t ends; every
token trained at step t must be of version max(0, t - K) without partial rollouts (never more than K
behind with them); partial rollouts must cut each response at the sync (versions v then v + 1,
continuation = prompt + partial response) and `mask` / `correct` must zero / keep the old tokens; `drop`
must drop the rollouts the bound excludes; a resume (K = 2, mid-run) must train the same batches on the
same prompts and log the same rows as the uninterrupted run.
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
from slime_ext.orchestration.async_rollouts import QUEUE_KEY, async_rollouts
from slime_ext.data.generation import continuation_seed
from slime_ext.orchestration.rollout_manager import RolloutManager
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
    if cfg.rollout.max_staleness:
        return async_rollouts(cfg, manager, engine)
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


TIMING = ("time/", "perf/", "async/engine_idle_frac", "async/trainer_idle_frac", "memory/", "peak")


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def test_rollout_t_plus_1_overlaps_train_t_and_is_exactly_one_version_stale(tmp_path):
    # train steps take 0.4 s, a rollout 8 ticks of 0.02 s: rollout t+1 fits inside train t
    engine, group, rows = run(tmp_path, "rollout.max_staleness=1", delay=0.4, tick=0.02)
    assert engine.versions == [1, 2, 3, 4]
    for t in range(3):  # rollout t+1 started generating before train step t ended (and after it began)
        assert group.train_times[t][0] - 0.05 < engine.started[t + 1] < group.train_times[t][1]
    for t, trained in group.trained.items():
        assert len(trained) == 4 and all(len(ids) == MAX_NEW for _, _, ids, *_ in trained)
        # rollouts 0 and 1 are generated with version 0; every later one with version t-1
        assert all(versions == [max(t - 1, 0)] * MAX_NEW for *_, versions, _, _ in trained)
        assert all(lps == [-(max(t - 1, 0) + 1) / 10] * MAX_NEW for *_, lps in trained)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [(r["async/tokens_behind_0"], r["async/tokens_behind_1"]) for r in rows] == \
        [(4.0 * MAX_NEW, 0.0)] + [(0.0, 4.0 * MAX_NEW)] * 3
    assert [r["rollout/partial_aborted"] for r in rows] == [0.0] * 4
    assert [r["async/dropped_groups"] for r in rows] == [0.0] * 4
    # the engines generate during the 0.4 s training (a 0.16 s rollout): idle most of the step, never all of it
    # while a next rollout runs; the trainer waits only for rollout 0 (nothing could hide it)
    assert all(0.2 < r["async/engine_idle_frac"] < 0.95 for r in rows[:3]), [r["async/engine_idle_frac"] for r in rows]
    assert rows[3]["async/engine_idle_frac"] > 0.9  # nothing left to generate beside the last step
    assert rows[0]["async/trainer_idle_frac"] > 0.1 and all(r["async/trainer_idle_frac"] < 0.1 for r in rows[1:])
    assert not any(k.startswith("_") for r in rows for k in r)


def test_async_trains_the_same_prompts_and_responses_as_on_policy(tmp_path):
    """Only the weights behind the tokens differ: the same prompts per step, the same seeds (the fake
    engine's tokens are a function of them), and the on-policy run keeps its metrics and no versions."""
    _, on, on_rows = run(tmp_path / "on")
    _, off, _ = run(tmp_path / "off", "rollout.max_staleness=2")
    assert {t: [x[:3] for x in b] for t, b in on.trained.items()} == {t: [x[:3] for x in b] for t, b in off.trained.items()}
    assert all(versions is None for b in on.trained.values() for *_, versions, _, _ in b)
    assert not any(k.startswith(("rollout/staleness", "rollout/partial", "async/")) for r in on_rows for k in r)


@pytest.mark.parametrize("k", [2, 4])
def test_without_partial_rollouts_rollout_r_is_exactly_version_r_minus_k(tmp_path, k):
    """With stale_groups wait the engines run up to K rollouts ahead and each rollout r is generated by version
    max(0, r - K) whatever the timing (a slow trainer here: the engines wait at the bound)."""
    engine, group, rows = run(tmp_path, f"rollout.max_staleness={k}", steps=7, delay=0.15, tick=0.002)
    for t, trained in group.trained.items():
        assert all(versions == [max(t - k, 0)] * MAX_NEW for *_, versions, _, _ in trained), (t, trained[0][3])
    assert [r["rollout/staleness_max"] for r in rows] == [float(min(t, k)) for t in range(7)]
    assert max(r["rollout/staleness_max"] for r in rows) <= k
    assert all(r[f"async/tokens_behind_{min(t, k)}"] == 4.0 * MAX_NEW for t, r in enumerate(rows))
    # at most K + 1 rollouts generated before the first sync (0..K with version 0), and no rollout past the last step
    assert sorted(engine.started) == list(range(7))
    assert [r["async/rollout_index"] for r in rows] == [float(t) for t in range(7)]


@pytest.mark.parametrize("stale", ["mask", "correct"])
def test_partial_rollouts_abort_at_the_sync_and_continue_with_the_new_version(tmp_path, stale):
    # no save between steps: a save finishes the rollout in flight, which this fake holds until a sync aborts it
    engine, group, rows = run(tmp_path, "rollout.max_staleness=1", "rollout.partial_rollouts=true",
                              f"rollout.stale_tokens={stale}", "run.save_every=100", hold=True)
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


def test_partial_rollouts_at_k2_never_wait_and_stay_within_the_bound(tmp_path):
    """The engines generate through every sync (aborted and continued); every prompt is trained once, and no
    trained token is more than 2 versions behind."""
    engine, group, rows = run(tmp_path, "rollout.max_staleness=2", "rollout.partial_rollouts=true",
                              "rollout.stale_tokens=correct", steps=6, delay=0.05, tick=0.01)
    assert max(r["rollout/staleness_max"] for r in rows) <= 2
    for t, trained in group.trained.items():
        assert all(max(t - 2, 0) <= v <= t for *_, versions, _, _ in trained for v in versions)
    seen = [x[1] for t in range(6) for x in group.trained[t]]
    assert len(seen) == 24 and len(set(seen)) == 12  # two prompts x two samples a step, each prompt once
    assert all(r["time/sync_wait"] == 0.0 for r in rows)


def test_drop_discards_the_rollouts_the_bound_excludes_and_counts_them(tmp_path):
    """stale_groups drop, K = 1: the engines run 2 rollouts ahead whatever the version; with a slow trainer,
    rollout 2 (started while step 0 trained, version 0) would be 2 behind at step 2: dropped, and step 2
    trains rollout 3 instead. Every trained token stays within the bound."""
    engine, group, rows = run(tmp_path, "rollout.max_staleness=1", "rollout.stale_groups=drop", steps=5,
                              delay=0.2, tick=0.002)
    assert max(r["rollout/staleness_max"] for r in rows) <= 1
    for t, trained in group.trained.items():
        assert all(t - 1 <= v <= t for *_, versions, _, _ in trained for v in versions), t
    assert sum(r["async/dropped_groups"] for r in rows) >= 2  # at least rollout 2's two groups
    assert rows[2]["async/dropped_groups"] == 2.0 and rows[2]["async/rollout_index"] == 3.0
    assert rows[-1]["async/dropped_groups_total"] == sum(r["async/dropped_groups"] for r in rows)
    trained_ids = [x[0] for t in range(5) for x in group.trained[t]]
    assert not any(sid.startswith("s2-") for sid in trained_ids)  # the dropped rollout never trains


@pytest.mark.parametrize("partial", [False, True])
def test_resume_at_k2_mid_run_matches_the_uninterrupted_run(tmp_path, monkeypatch, partial):
    """Killed after step 3's row at K = 2 (checkpoint after step 2 holds rollouts 3 and 4, generated with
    versions 1 and 2): the resumed steps train the saved rollouts without regenerating them, then the same
    batches as the uninterrupted run; without partial rollouts every logged key but timings is equal, with
    them the versions depend on timing but no prompt is skipped or trained twice and the bound holds."""
    monkeypatch.setattr(training_job, "_prune_checkpoints", lambda directory: None)  # keep iter 3 to resume from
    extra = ["rollout.max_staleness=2"] + (["rollout.partial_rollouts=true", "rollout.stale_tokens=correct"]
                                           if partial else [])
    _, whole, whole_rows = run(tmp_path / "whole", *extra, steps=7, delay=0.05, tick=0.002)
    first = tmp_path / "cut"
    _, cut, _ = run(first, *extra, steps=7, delay=0.05, tick=0.002)
    ckpt = first / "checkpoints"
    saved = pickle.loads((ckpt / "iter_0000003" / "rank_00000.pt").read_bytes())
    queue = saved["manager"][QUEUE_KEY]
    saved_rollouts = [q["index"] for q in queue["rollouts"]]
    assert saved["step"] == 3 and queue["taken"] == 3 and queue["next"] == saved_rollouts[-1] + 1
    if not partial:
        assert saved_rollouts == [3, 4] and [q["started_version"] for q in queue["rollouts"]] == [1, 2]
    else:  # the engines went on after sync 3 (a rollout may start up to version 3 + K = 5), finished at the save
        assert saved_rollouts in ([3, 4], [3, 4, 5])
    (ckpt / "latest").write_text("iter_0000003\n")  # killed after step 3's row: resume from step 3
    cfg = config("train.steps=7", *extra)
    engine, group = FakeEngine(tick=0.002), FakeGroup(delay=0.05)
    job, manager = job_for(cfg, first), manager_for(cfg, engine)
    start = job._resume(group, manager, engine, ckpt)
    assert start == 3 and [r["step"] for r in metrics(first)] == [0, 1, 2]
    job._rl_loop(start, manager, group, engine, ckpt)
    assert engine.versions == [3, 4, 5, 6, 7]  # restored weights as version 3, then each step's sync
    assert not any(step_of(q.rid) in saved_rollouts for q in engine.requests)  # the saved ones, not regenerated
    rows_seen = [x[1] for t in range(7) for x in (cut.trained[t] if t < 3 else group.trained[t])]
    assert rows_seen == [x[1] for t in range(7) for x in whole.trained[t]]
    assert [r["step"] for r in metrics(first)] == list(range(7))
    assert max(r["rollout/staleness_max"] for r in metrics(first)) <= 2
    if not partial:
        assert {t: whole.trained[t] for t in range(3, 7)} == group.trained
        assert untimed(metrics(first)) == untimed(whole_rows)


def test_resume_from_a_checkpoint_without_a_queue_regenerates_from_the_data_offset(tmp_path):
    """An on-policy run's checkpoint, resumed with max_staleness 1: rollout 2 is generated at the resume
    (with the restored weights, version 2) from the saved data offset."""
    _, on, _ = run(tmp_path, steps=2)
    cfg = config("train.steps=4", "rollout.max_staleness=1")
    engine, group = FakeEngine(), FakeGroup()
    job, manager = job_for(cfg, tmp_path), manager_for(cfg, engine)
    start = job._resume(group, manager, engine, tmp_path / "checkpoints")
    job._rl_loop(start, manager, group, engine, tmp_path / "checkpoints")
    assert start == 2 and sorted(group.trained) == [2, 3]
    assert all(v == [2] * MAX_NEW for *_, v, _, _ in group.trained[2])  # generated now: version 2, staleness 0
    assert all(v == [2] * MAX_NEW for *_, v, _, _ in group.trained[3])  # generated beside step 2
    seen = [x[1] for t in (0, 1) for x in on.trained[t]] + [x[1] for t in (2, 3) for x in group.trained[t]]
    assert len(seen) == 16 and len(set(seen)) == 8  # two prompts x two samples a step, each prompt once


def test_tokens_older_than_the_version_a_rollout_started_with_are_a_stale_rollout():
    """An engine that reports serving an older version than the one the rollout started with missed a sync."""
    cfg = config("train.steps=4", "rollout.max_staleness=1")

    class Reporting(FakeEngine):
        def generate(self, requests: list) -> list:
            import dataclasses

            return [dataclasses.replace(r, weight_version="1") for r in super().generate(requests)]

    manager = RolloutManager(cfg, ROWS, Tokenizer(), Reporting())
    manager.rollout(3, weight_version=1)  # the version it started with: fine
    with pytest.raises(StaleRollout, match=r"rollout 4: 4 request\(s\) hold tokens of weight versions older than 2"):
        manager.rollout(4, weight_version=2)


def test_a_continued_request_keeps_its_flags_and_each_tokens_routes():
    """Partial rollouts with routing replay (Miles #3277): the continuation asks for routed experts again; the
    engine re-prefilled the earlier tokens under the new weights, so its rows for them are new-version routes.
    The merged result keeps the first call's rows for every position that produced an old-version token and
    the continuation's from the cut on: each token is trained on the routes of the version that produced it."""
    import torch

    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest, GenerateResult
    from slime_ext.orchestration.rollout_manager import _Partial

    q = GenerateRequest("r0", [5, 6, 7], SamplingParams(max_new_tokens=8), seed=3, return_routed_experts=True)
    p = _Partial(q)
    old = torch.full((3 + 2 - 1, 2, 2), 4, dtype=torch.int16)  # version 4's routes: prompt and 2 tokens
    p.add(GenerateResult("r0", [8, 9], [-1.0, -1.0], "abort", [{}, {}], 0, 3, routed_experts=old), 4)
    follow = p.continuation()
    assert follow.return_routed_experts and follow.input_ids == [5, 6, 7, 8, 9]
    assert follow.sampling.max_new_tokens == 6 and follow.rid == "r0" and follow.seed != q.seed
    new = torch.full((5 + 3 - 1, 2, 2), 5, dtype=torch.int16)  # re-prefill + 3 tokens, all under version 5
    p.add(GenerateResult("r0", [10, 11, 1], [-1.0] * 3, "stop", [{}] * 3, 5, 5, routed_experts=new), 5)
    merged = p.result()
    assert merged.output_ids == [8, 9, 10, 11, 1] and p.versions == [4, 4, 5, 5, 5]
    routes = merged.routed_experts
    assert routes.shape[0] == 3 + 5 - 1
    # row i produced token i + 1: tokens at positions 3, 4 (8, 9) came from version 4 -> rows 0..3 are version
    # 4's; tokens 10, 11, 1 (positions 5..7) from version 5 -> rows 4..6 are version 5's
    assert routes[:4].eq(4).all() and routes[4:].eq(5).all()
    # the trainer's view: the route of each response token's forward is that token's version
    per_token = [int(routes[3 + k - 1, 0, 0]) for k in range(5)]
    assert per_token == p.versions


class EnginePausing(FakeEngine):
    """SGLang's /pause_generation retract / in_place: the requests stay in the engine across the sync, and the
    answer reports every token's version (meta_info.weight_versions). A rollout of step >= 1 makes HOLD tokens,
    then waits until the engine has been paused and continued (a sync came); a pause lands only once the
    request in flight has its HOLD tokens (so the cut is the same on any machine)."""

    def __init__(self):
        super().__init__()
        self.pauses: list[str] = []
        self.cycles = 0  # pause + continue pairs so far
        self.holding = False  # a generate call is in flight and has not reached its hold yet
        self._cv = threading.Condition()

    def pause_generation(self, mode: str) -> int:
        self.pauses.append(mode)
        with self._cv:
            self._cv.wait_for(lambda: not self.holding, timeout=10)
        return 4

    def continue_generation(self) -> None:
        with self._cv:
            self.cycles += 1
            self._cv.notify_all()

    def generate(self, requests: list) -> list:
        step = step_of(requests[0].rid)
        self.started.setdefault(step, time.time())
        self.requests += requests
        with self._cv:
            cycles, self.holding = self.cycles, step >= 1
        out: dict[str, list] = {q.rid: [] for q in requests}
        versions: dict[str, list] = {q.rid: [] for q in requests}
        for k in range(MAX_NEW):
            if step >= 1 and k == HOLD:
                with self._cv:  # let the sync's pause land, wait for its continue (bounded: a missing one fails)
                    self.holding = False
                    self._cv.notify_all()
                    self._cv.wait_for(lambda: self.cycles > cycles, timeout=10)
            for q in requests:
                out[q.rid].append(10 + (q.seed + 7 * k) % 50)
                versions[q.rid].append(self.version)
        return [GenerateResult(q.rid, out[q.rid], [-(v + 1) / 10 for v in versions[q.rid]], "length",
                               [{} for _ in out[q.rid]], 0, len(q.input_ids),
                               token_versions=[str(v) for v in versions[q.rid]]) for q in requests]


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_engine_side_pause_keeps_the_requests_and_takes_each_tokens_reported_version(tmp_path, mode):
    """rollout.pause_mode retract / in_place: the sync pauses the engines (not the manager's aborts), no request
    is continued by the manager, and each token carries the version the engine reports for it."""
    cfg = config("train.steps=4", "rollout.max_staleness=1", "rollout.partial_rollouts=true",
                 "rollout.stale_tokens=correct", "rollout.engine=sglang", f"rollout.pause_mode={mode}",
                 "run.save_every=100")  # a save drains the rollout in flight, which this fake holds until a sync
    engine, group = EnginePausing(), FakeGroup(delay=0.3)  # rollout t + 1 reaches its hold while step t trains
    job_for(cfg, tmp_path)._rl_loop(0, manager_for(cfg, engine), group, engine, tmp_path / "checkpoints")
    assert engine.pauses == [mode] * 4 and engine.versions == [1, 2, 3, 4]
    assert all(len(q.input_ids) == PROMPT_LEN for q in engine.requests)  # nothing re-sent by the manager
    for t in range(1, 4):  # rollout t: HOLD tokens of version t - 1, the rest of version t
        for _, _, ids, versions, mask, lps in group.trained[t]:
            assert versions == [t - 1] * HOLD + [t] * (MAX_NEW - HOLD)
            assert lps == [-t / 10] * HOLD + [-(t + 1) / 10] * (MAX_NEW - HOLD)
    rows = metrics(tmp_path)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/partial_aborted"] for r in rows] == [0.0] * 4  # the manager aborted nothing
