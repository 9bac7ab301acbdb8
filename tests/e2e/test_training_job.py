"""The training loop through the full stack (Ray actors, Megatron trainer, embedded engine).

These runs use a tiny configuration so they take tens of seconds; the default job's numbers are in the
docs/results.md.
"""

from __future__ import annotations

import contextlib

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_ext.studies import read_metrics
from tests.conftest import CONFIGS, REPO

TINY = [
    "data.synthetic.n_train=400", "data.synthetic.n_eval=16", "tokenizer.n_training_texts=400",
    "model.hidden_size=64", "model.num_layers=2", "model.moe_intermediate_size=64", "model.intermediate_size=128",
    "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=8", "rollout.max_response_len=24",
    "train.micro_batch_size=16", "eval.n_prompts=8", "eval.n_samples=2", "eval.k=[1,2]",
]


def job_args(tmp: Path, *extra: str, cache: Path | None = None) -> list[str]:
    """The tiny GRPO job's arguments: runs under `tmp`, the cache in `cache` (default `tmp`/cache; the tests pass
    the session's `job_cache`, so jobs with the same settings share their tokenizer and SFT warm start)."""
    cache = cache or tmp / "cache"
    return [str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp / 'runs'}", f"run.cache_dir={cache}", *TINY, *extra]


@pytest.fixture(scope="module")
def _module_ray():
    """Ends the module's shared Ray (`shared_ray`) after its last test."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def shared_ray(_module_ray, monkeypatch):
    """One local Ray for this module's in-process jobs instead of a fresh one per `main()` call (about 5 s to
    start and stop each): started as the driver starts it (`init_ray`, which returns at once when Ray is up),
    and the driver's shutdown at the end of `main()` is skipped. Every job still kills its own actors and
    placement groups (TrainingJob's `finally`), so a job that leaked one would starve the next of CPUs. The
    driver's own shutdown is checked by the tests that run the CLI in a child process (Ctrl-C, actor death)."""
    from slime_ext.config import load_config
    from slime_ext.orchestration import driver
    from slime_ext.orchestration.training_job import init_ray

    init_ray(load_config(CONFIGS / "grpo.yaml", TINY).config)
    monkeypatch.setattr(driver, "_shutdown_ray", lambda: None)


@pytest.fixture
def no_ray_here():
    """The tests that kill a job's processes run it alone: no Ray of this process beside the child's own."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# Each method's job through the whole stack is a slow check (35-48 s each on a 2-core CI machine); the default run
# keeps every method's fast variants: its rollout step through the servers and the in-process engine
# (tests/methods/test_server_path.py), its config through the manager's hand-over with its loss spec reaching the
# trainer (tests/orchestration/test_one_method.py), and the stack itself under GRPO (the positive control here).
METHOD_JOB = pytest.mark.slow


@pytest.mark.timeout(900)
def test_positive_control_first_token_reward_rises(tmp_path, monkeypatch, job_cache, shared_ray):
    """A trivially learnable reward (the first response token has an even id) must go up under GRPO.

    Separates a broken loop (signs, masks, weight sync) from a task too hard for the model."""
    from slime_ext.orchestration.driver import main
    from slime_ext.methods.grpo.method import GRPO
    from slime_ext.rewards import ReasonCounter

    def first_token_even(self, groups):
        for group in groups:
            for s in group:
                s.reward = float(bool(s.response_ids) and s.response_ids[0] % 2 == 0)
        return ReasonCounter()

    monkeypatch.setattr(GRPO, "score", first_token_even)
    # 128 two-token rollouts per step from a random init: the first token's parity is the whole signal.
    # The patched scorer lives in this process, so the rollout manager runs in the driver here.
    rc = main(job_args(tmp_path, "sft.steps=0", "train.steps=10", "train.lr=1e-2", "run.stages=[data,tokenizer,rl]",
                       "rollout.manager=driver",
                       "run.save_every=100", "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=16",
                       "rollout.max_response_len=2", cache=job_cache))
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rewards = [m["reward/mean"] for m in read_metrics(run_dir)]
    assert len(rewards) == 10
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.2, rewards
    assert all(0 < m["time/sync"] < m["time/step"] for m in read_metrics(run_dir))
    assert all(abs(m["time/sync_share"] - m["time/sync"] / m["time/step"]) < 1e-12 for m in read_metrics(run_dir))
    # the step-0 consistency check (configs/base.yaml) ran before the first update, on step 0 only
    rows = read_metrics(run_dir)
    assert rows[0]["consistency/abs_diff_mean"] < 1e-4 and "consistency/abs_diff_mean" not in rows[1]
    assert rows[0]["train/mismatch/abs_diff_mean"] < 1e-4 and rows[0]["train/clip_frac"] == 0.0


@METHOD_JOB
@pytest.mark.timeout(900)
def test_tandem_job_trains_the_senior_and_leaves_the_junior_untouched(tmp_path, job_cache, shared_ray):
    """Tandem through the whole stack: authored rollouts, senior-only steps, the junior (the cached warm
    start) bit-identical afterwards, and the evaluation axes written."""
    import hashlib

    from slime_ext.orchestration.driver import main

    args = [str(CONFIGS / "tandem.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={job_cache}",
            *TINY, "sft.steps=3", "train.steps=2", "tandem.kappa=4", "tandem_axes.prompts=4"]
    assert main(args + ["run.stages=[data,tokenizer,sft]"]) == 0
    (sft_dir,) = (tmp_path / "runs").iterdir()
    warm = Path(json.loads((sft_dir / "summary.json").read_text())["stages"]["sft"]["warm_start"])  # the HF dir

    def digest() -> str:
        return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(warm.iterdir()))).hexdigest()

    before = digest()
    assert main(args) == 0
    assert digest() == before
    run_dir = max((tmp_path / "runs").iterdir())
    assert json.loads((run_dir / "summary.json").read_text())["stages"]["sft"]["warm_start"] == str(warm)
    metrics = read_metrics(run_dir)
    assert len(metrics) == 2
    for m in metrics:
        assert 0.0 < m["tandem/senior_token_share"] < 1.0 and m["tandem/handoffs_per_rollout"] > 0
        # only senior tokens are trained: the trainer's token count is the senior share of the rollouts
        assert m["train/tokens"] == pytest.approx(m["tandem/senior_token_share"] * m["rollout/generated_tokens"])
    axes = json.loads((run_dir / "tandem_axes.json").read_text())
    assert {"handoff_alternate", "handoff_bernoulli", "drift", "legibility"} <= set(axes)
    assert (run_dir / "plots" / "drift_survival.png").stat().st_size > 0


@METHOD_JOB
@pytest.mark.timeout(900)
def test_duet_and_dapo_jobs_run_through_the_stack(tmp_path, job_cache, shared_ray):
    from slime_ext.orchestration.driver import main

    common = [f"run.cache_dir={job_cache}", *TINY, "sft.steps=3", "train.steps=2"]
    assert main([str(CONFIGS / "duet.yaml"), f"run.output_dir={tmp_path / 'duet'}", *common,
                 "duet.budget_fraction=0.5", "duet.grace=2", "duet.poll=2"]) == 0
    (duet_dir,) = (tmp_path / "duet").iterdir()
    for m in read_metrics(duet_dir):
        aborted = m["duet/abort_rate"] * m["duet/rollouts"]  # a share of whole rollouts
        assert m["duet/rollouts"] >= 4 and aborted == pytest.approx(round(aborted), abs=1e-9)
        assert m["duet/budget_tokens"] > 0 and m["time/controller"] < m["time/step"]
    assert main([str(CONFIGS / "dapo.yaml"), f"run.output_dir={tmp_path / 'dapo'}", *common, "dapo.overlong_buffer=8",
                 "train.global_batch_size=8"]) == 0
    (dapo_dir,) = (tmp_path / "dapo").iterdir()
    for m in read_metrics(dapo_dir):
        assert m["dapo/drawn_groups"] == 6  # 1.5 x 4 prompts
        # the informative groups' samples (8 each) in mini-batches of 8; the old logprobs recomputed
        assert m["train/optimizer_steps"] == max(1, m["dapo/trained_groups"]) and "train/mismatch/abs_diff_mean" in m


@METHOD_JOB
@pytest.mark.timeout(900)
def test_sxs_sft_then_rl_jobs(tmp_path, job_cache, shared_ray):
    """SxS stage 1 (SFT on interleaved data, evaluated on the visible answer with latency metrics) and
    stage 2 (RL with channel annotations) through the stack."""
    from slime_ext.orchestration.driver import main

    common = [f"run.cache_dir={job_cache}", *TINY, "sft.steps=3", "rollout.max_response_len=48"]
    assert main([str(CONFIGS / "sxs_sft.yaml"), f"run.output_dir={tmp_path / 'sft'}", *common]) == 0
    (sft_dir,) = (tmp_path / "sft").iterdir()
    report = json.loads((sft_dir / "eval_sft.json").read_text())
    assert set(report["meta"]["response_metrics"]) >= {"ari", "abo", "airw", "think_blocks", "first_disclosure"}
    assert main([str(CONFIGS / "sxs_rl.yaml"), f"run.output_dir={tmp_path / 'rl'}", *common, "train.steps=2",
                 "eval.every=1"]) == 0
    (rl_dir,) = (tmp_path / "rl").iterdir()
    # eval.every=1 of 2 steps: one evaluation between the steps, with the method's hooks (scored on the visible
    # answer, latency metrics) although the rollout manager actor held the method then; none again at step 2
    assert sorted(p.name for p in rl_dir.glob("eval_*.json")) == ["eval_final.json", "eval_step1.json",
                                                                 "eval_warm_start.json"]
    between = json.loads((rl_dir / "eval_step1.json").read_text())
    assert set(between["meta"]["response_metrics"]) >= {"airw", "think_blocks"}
    assert len((rl_dir / "eval_step1.records.jsonl").read_text().splitlines()) == 8  # eval.n_prompts
    for m in read_metrics(rl_dir):
        assert m["sxs/think_blocks"] >= 0 and m["sxs/shaped_groups"] == 0.0  # sxs_rl.yaml: no QP shaping
        dropped = m["sxs/dropped_groups"] * 4  # a share of the step's 4 prompt groups
        assert dropped == pytest.approx(round(dropped), abs=1e-9)


@METHOD_JOB
@pytest.mark.timeout(900)
def test_dagrpo_job_with_phases_and_a_cloud_endpoint(tmp_path, job_cache, shared_ray):
    """DA-GRPO through the stack: a cloud served over HTTP, two task phases, lambda updated every step,
    every phase's held-out set evaluated after each phase, the continual table written."""
    from transformers import AutoModelForCausalLM

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.orchestration.driver import main
    from slime_ext.tools.serve import ServerState, serve
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    cloud_dir = tmp_path / "cloud"
    tok = train_tokenizer(["Step 1: 1 + 2 = 3.\n\\boxed{3}"] * 20, vocab_size=280, out_dir=cloud_dir)
    # room for whole task prompts: the server refuses prompts past the model's positions (issue 15)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), max_position_embeddings=2048)).save_pretrained(cloud_dir)
    state = ServerState(EmbeddedEngine.from_pretrained(str(cloud_dir)), load_tokenizer(cloud_dir), "cloud", max_tokens=8)
    srv = serve(state)
    try:
        phases = "[{name: easy, levels: [L1], steps: 1, tau: 0.2}, {name: hard, levels: [L3], steps: 1, tau: 0.2}]"
        rc = main([str(CONFIGS / "dagrpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={job_cache}",
                   *TINY, "sft.steps=3", "train.steps=2", "eval.n_prompts=4", f"dagrpo.phases={phases}",
                   f"dagrpo.cloud_url=http://127.0.0.1:{srv.server_address[1]}", "dagrpo.lambda_init=0.5",
                   "dagrpo.eta_lambda=0.05"])
    finally:
        srv.shutdown()
        state.batcher.close()
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    metrics = read_metrics(run_dir)
    assert [m["dagrpo/phase"] for m in metrics] == [0.0, 1.0]
    for m in metrics:  # lambda <- max(0, lambda + eta (rate - tau))
        assert m["dagrpo/lambda_next"] == pytest.approx(max(0.0, m["dagrpo/lambda"] + 0.05 * (m["dagrpo/cloud_rate"] - 0.2)))
        # a live endpoint: every call answered, nothing skipped by the breaker
        assert m["dagrpo/cloud_failures"] == m["dagrpo/cloud_skipped"] == m["dagrpo/cloud_degraded"] == 0.0
    for k in (0, 1):
        after = json.loads((run_dir / f"eval_after_phase_{k}.json").read_text())
        assert set(after) == {"easy", "hard"} and all(v["n"] == 4 for v in after.values())
        for v in after.values():  # accuracies and the cloud rate are shares of the 4 held-out prompts
            for key in ("joint_accuracy", "cloud_rate"):
                assert v[key] * 4 == pytest.approx(round(v[key] * 4), abs=1e-9)
        assert all("router_clf_joint_accuracy" in v and "random_router_joint_accuracy" in v for v in after.values())
        assert all(v["cloud_calls"] == 4 and v["cloud_failures"] == v["cloud_skipped"] == 0 for v in after.values())
    table = (run_dir / "continual_table.md").read_text()
    assert "| easy |" in table and "| hard |" in table


def _default_sigint() -> None:
    """A suite started in the background (`cmd &` in a script) ignores SIGINT, and children inherit that;
    the driver must see Ctrl-C as a terminal user's job does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slime_ext.orchestration.driver", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)


def _wait_for_steps(runs: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(runs.glob("*/metrics.jsonl")) if runs.exists() else []
        if found and len(found[0].read_text().splitlines()) >= n:
            return found[0].parent
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"no {n} steps within {timeout} s")


# 3 SFT steps, as the other tiny GRPO jobs (test_multinode, DUET and DAPO): one warm start in `job_cache` for all
LONG_RUN = ["sft.steps=3", "train.steps=200", "run.stages=[data,tokenizer,sft,rl]"]


@pytest.mark.timeout(600)
# both actors' deaths are slow checks (~45 s each); the message and checkpoint rules for an actor that dies in any
# phase have fast tests (tests/orchestration/test_resume.py), and Ctrl-C below keeps a CLI fault path in the default run
@pytest.mark.slow
@pytest.mark.parametrize("actor", ["EmbeddedEngineActor", "TrainWorker"])
def test_actor_death_stops_the_run_with_its_checkpoint_and_a_message(tmp_path, actor, job_cache, no_ray_here):
    """An engine or a trainer rank killed mid-run (as Ray's memory monitor would): exit 1 with one message
    naming the intact checkpoint and the resume command, without Ray's traceback."""
    import psutil

    env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    proc = _run_cli(job_args(tmp_path, *LONG_RUN, cache=job_cache), env)
    run_dir = _wait_for_steps(tmp_path / "runs", 2, proc)
    victims = [p for p in psutil.Process(proc.pid).children(recursive=True) if actor in " ".join(p.cmdline())]
    assert victims, f"no {actor} process found"
    for p in victims:  # killing one rank can take the other down before its turn (CI: NoSuchProcess)
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert proc.wait(timeout=300) == 1
    err = proc.stderr.read()
    assert "run stopped: a Ray actor died during " in err and f"Resume with: bash scripts/run.sh resume={run_dir}" in err, \
        err[-3000:]
    assert "the last intact checkpoint is " in err and "Traceback" not in err, err[-3000:]
    assert (run_dir / "checkpoints" / "latest").exists()
    done = len(read_metrics(run_dir))
    assert (run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()).exists()
    assert done >= 2


@pytest.mark.timeout(600)
def test_ctrl_c_ends_every_ray_process_and_keeps_the_checkpoint(tmp_path, job_cache, no_ray_here):
    import psutil

    env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    proc = _run_cli(job_args(tmp_path, *LONG_RUN, cache=job_cache), env)
    run_dir = _wait_for_steps(tmp_path / "runs", 1, proc)
    # step 0's row is logged just before its checkpoint is saved: wait for the save, so the interrupt has one to keep
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    started = psutil.Process(proc.pid).children(recursive=True)
    assert any("TrainWorker" in " ".join(p.cmdline()) for p in started)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    rc = proc.wait(timeout=300)
    err = proc.stderr.read()
    assert rc == 130, err[-3000:]
    assert "interrupted" in err and f"resume={run_dir}" in err, err[-3000:]
    _, alive = psutil.wait_procs(started, timeout=60)
    assert not alive, [(p.pid, p.cmdline()[:3]) for p in alive]
    assert (run_dir / "checkpoints" / "latest").exists()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_run_resumes_and_continues_the_metrics(tmp_path, no_ray_here):
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


TIMING_KEYS = ("time/", "perf/", "memory/", "driver_memory", "async/engine_idle_frac", "async/trainer_idle_frac",
               "async/queued", "peak_rss")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_ctrl_c_at_k2_and_resume_matches_the_uninterrupted_run(tmp_path, job_cache, no_ray_here):
    """Asynchronous RL at K = 2 through the real stack (manager actor, embedded engine actor, Megatron trainer):
    Ctrl-C mid-run, resume; every step's row equals the uninterrupted run's in every key but timings (the queued
    rollouts are in the checkpoint, rollout r is generated by version max(0, r - 2) in both runs)."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    common = ["sft.steps=3", "train.steps=6", "run.stages=[data,tokenizer,sft,rl]", "rollout.max_staleness=2"]
    reference = _run_cli(job_args(tmp_path / "ref", *common, cache=job_cache), env)
    assert reference.wait(timeout=900) == 0, reference.stderr.read()[-3000:]
    (ref_dir,) = (tmp_path / "ref" / "runs").iterdir()

    victim = _run_cli(job_args(tmp_path / "cut", *common, cache=job_cache), env)
    run_dir = _wait_for_steps(tmp_path / "cut" / "runs", 3, victim)
    os.killpg(victim.pid, signal.SIGINT)
    assert victim.wait(timeout=300) == 130, victim.stderr.read()[-3000:]
    resumed = _run_cli([f"resume={run_dir}"], env)
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()[-3000:]
    got, want = read_metrics(run_dir), read_metrics(ref_dir)
    assert [m["step"] for m in got] == list(range(6))
    assert max(m["rollout/staleness_max"] for m in got) <= 2
    for a, b in zip(got, want):
        keys = {k for k in a if not k.startswith(TIMING_KEYS)} | {k for k in b if not k.startswith(TIMING_KEYS)}
        for k in sorted(keys):
            assert a.get(k) == pytest.approx(b.get(k), rel=1e-4, abs=1e-7), (a["step"], k, a.get(k), b.get(k))


def test_missing_model_path_is_a_clear_error(tmp_path, capsys, job_cache):
    from slime_ext.orchestration.driver import main

    with pytest.raises(FileNotFoundError, match="model.hf_path=/nonexistent/ckpt: no config.json"):
        main(job_args(tmp_path, "model.hf_path=/nonexistent/ckpt", "run.stages=[data,tokenizer,sft]", cache=job_cache))


def test_method_config_errors_surface_before_sft(tmp_path, capsys):
    from slime_ext.orchestration.driver import main

    code = main([str(CONFIGS / "dagrpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'c'}",
                 *TINY, "run.stages=[data,tokenizer,sft,rl]", "dagrpo.cloud_url=null"])
    err = capsys.readouterr().err
    # a validation error now (the same one `--check` reports), naming the override; nothing ran
    assert code == 2 and "command line override 'dagrpo.cloud_url=null'" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "warmstart").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("partial", [False, True])
def test_async_job_through_ray(tmp_path, partial):
    """Asynchronous RL (K = 1) through the real stack: the rollout manager actor (a threaded actor with partial
    rollouts, so the pause before a sync reaches it mid-rollout), the embedded engine actor's aborts, the
    Megatron trainer. Versions: the embedded engine reports none, so the manager's tracked ones are checked
    against the [step - 1, step] window (a wrong one raises StaleRollout and the run fails)."""
    from slime_ext.orchestration.driver import main

    extra = ["rollout.partial_rollouts=true"] if partial else []
    rc = main(job_args(tmp_path, "sft.steps=0", "train.steps=3", "run.stages=[data,tokenizer,rl]",
                       "rollout.max_staleness=1", *extra))
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(run_dir)
    assert [m["step"] for m in rows] == [0, 1, 2]
    assert rows[0]["rollout/staleness_max"] == 0.0  # step 0's rollout precedes any training
    if not partial:  # every later token is exactly one version behind the trainer
        assert [m["rollout/staleness_mean"] for m in rows[1:]] == [1.0, 1.0]
    assert all(0 <= m["rollout/staleness_max"] <= 1 for m in rows)
    assert all(0.0 <= m["async/engine_idle_frac"] <= 1.0 and 0.0 <= m["async/trainer_idle_frac"] <= 1.0 for m in rows)
    assert rows[0]["async/engine_idle_frac"] < 1.0  # rollout 1 generates beside step 0's training
