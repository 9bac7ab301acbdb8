"""The training loop on Ray: SFT warm start (cached), then RL steps with weight sync, checkpoints, resume.

One RL step (docs/architecture.md):
  rollout manager: plan -> engine.generate -> finish (rewards, advantages); the method's loss spec
  train group:     (reference logprobs if KL) -> optimizer step with that loss spec
  weight sync:     Megatron -> HF names -> engine update (the engine flushes its prefix cache)
  method.update:   controllers (in the rollout manager, which holds the method during RL)
With `rollout.max_staleness: K` >= 1 the next rollouts run beside training
(`slime_ext.orchestration.async_rollouts.AsyncRollouts` stands in for the manager and the engine).
A checkpoint (trainer ranks + rollout manager state + step) is written every `run.save_every` steps
(default: every step, so a killed run loses at most the step in flight); `metrics.jsonl` is truncated
to the checkpointed step on every start (to empty when no checkpoint exists yet), so the resumed
metrics continue the original ones. When a Ray actor dies (or Ray's memory monitor kills a worker) in
setup, a step, a checkpoint save or the final export, the run stops with `RunStopped`: what was
running, the last intact checkpoint (one whose save did not finish is never `latest`) and the resume
command.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import ray
from tqdm import tqdm

from megatron_glue.hf_config import hf_config_from_model_config
from megatron_glue.model_provider import ParallelSizes
from megatron_glue.trainer import TrainerSettings
from megatron_glue.trainer_checkpoint import latest_checkpoint
from slime_ext.algo import LossSpec
from slime_ext.config.schema import Config
from slime_ext.data import Sample
from slime_ext.engine.engine_server import INITIAL_VERSION
from slime_ext.engine.failures import EngineFailure
from slime_ext.methods.base import Method
from slime_ext.orchestration.data_source import DataSource
from slime_ext.orchestration.local_endpoints import build_run_method
from slime_ext.orchestration.async_rollouts import AsyncRollouts, async_rollouts
from slime_ext.orchestration.placement import actor_groups, build_placement, ray_options
from slime_ext.orchestration.rollout_manager import ENGINE_EVENTS_KEY, RemoteRolloutManager, RolloutManager
from slime_ext.orchestration.run_engine import adapter_name, colocated_sleep, start_engine, start_scoring_servers
from slime_ext.orchestration.run_logger import RunLogger
from slime_ext.orchestration.run_dir import (PEAK_RSS_KEY, RunStopped, append_engine_events, engine_event_line,
                                             peak_rss_from_metrics, resume_command, truncate_metrics)
from slime_ext.orchestration.trainer_settings import trainer_settings
from slime_ext.methods.registry import data_transform
from slime_ext.tasks.dataset import LoadReport
from slime_ext.tasks.prepare import transform_key
from slime_ext.tasks.lengths import LengthLimits, PromptTooLong, drop_too_long, prompt_token_ids
from slime_ext.tokenizer import checkpoint_with_vocabulary
from slime_ext.tasks.response_tokens import sft_response
from slime_ext.orchestration.train_group import TrainGroup
from slime_ext.orchestration.warm_start_marker import MARKER, write_marker

log = logging.getLogger("slime_ext.orchestration.training_job")
WARM_FORMAT = "warmstart-v1"
KEEP_CHECKPOINTS = 2
# Ray's ways of saying an actor or its worker process is gone (a Python error inside an actor method is a
# RayTaskError and stays a traceback). RayActorError covers ActorDiedError and ActorUnavailableError, and a
# RayTaskError caused by one (a manager whose engine died); OutOfMemoryError is the memory monitor's kill.
ACTOR_FAILURES: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError, ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError, ray.exceptions.ObjectLostError,
)


class _DropRayTokenAuthNotice(logging.Filter):
    """Ray >= 2.50 turns token authentication on for a new local instance and says so on every start. The
    default stays on (it is the secure one); only this notice is dropped, since it asks for no action."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def init_ray(config: Config) -> None:
    if ray.is_initialized():
        return
    notice_logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropRayTokenAuthNotice) for f in notice_logger.filters):
        notice_logger.addFilter(_DropRayTokenAuthNotice())
    if config.cluster.ray_address:
        ray.init(address=config.cluster.ray_address, log_to_driver=True)
    else:
        # address="local": always a fresh single-machine instance, never another job's cluster
        ray.init(address="local", num_cpus=max(2, config.rollout.threads + config.train.threads),
                 include_dashboard=False, log_to_driver=False, configure_logging=False)


def sft_threads_per_rank(config: Config, ranks: int) -> int:
    """SFT runs with no engine: the engine's threads go to the trainer, shared among its ranks (two ranks of one
    thread beat one rank of two on small matrices: the Python and the small products run in parallel)."""
    return max(1, (config.train.threads + config.rollout.threads) // ranks)


def sft_samples(rows: list[dict], tokenizer: Any, template: str, max_len: int, prefix: str) -> list[Sample]:
    """Prompt (masked out) + reference solution + EOS (trained, cut at `max_len` in all) for each row. Rows
    too long were skipped when the SFT rows were built (`TrainingJob.sft_rows`); a prompt that fills
    `max_len` by itself is an error, never a batch padded to it. A solution that calls tools is tokenised piece
    by piece as an episode is, its observations with loss mask 0; the length check counts the same ids
    (`slime_ext.tasks.response_tokens.sft_response`)."""
    out = []
    for i, row in enumerate(rows):
        prompt = prompt_token_ids(tokenizer, template, row["prompt"])
        if len(prompt) >= max_len:
            raise PromptTooLong(f"SFT row {row.get('row_id', i)}: a prompt of {len(prompt)} tokens leaves no room "
                                f"for its solution in {max_len} tokens (too-long rows are skipped earlier)")
        cut = max(1, max_len - len(prompt))
        response, mask = sft_response(tokenizer, row)
        out.append(Sample(f"{prefix}{i}", prompt, response[:cut], loss_mask=mask[:cut]))
    return out


def _append_jsonl(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


@contextmanager
def stop_on_actor_failure(what: str, run_dir: Path, ckpt_dir: Path) -> Iterator[None]:
    """Turn a dead actor or worker during `what` into `RunStopped` naming the last intact checkpoint
    and the resume command, instead of Ray's raw traceback (the checkpoints on disk are fine)."""
    try:
        yield
    except ACTOR_FAILURES as exc:
        raise RunStopped(actor_failure_message(what, exc, run_dir, ckpt_dir)) from exc
    except EngineFailure as exc:  # in the driver, or passed on by the rollout manager actor (Ray wraps it)
        cause = vars(exc).get("cause") if isinstance(exc, ray.exceptions.RayTaskError) else exc
        raise RunStopped(engine_failure_message(what, cause if isinstance(cause, BaseException) else exc,
                                                run_dir, ckpt_dir)) from exc


def _checkpoint_sentence(ckpt_dir: Path) -> str:
    intact = latest_checkpoint(ckpt_dir)
    return (f"the last intact checkpoint is {intact} (a save that did not finish is never marked latest)"
            if intact is not None else "no checkpoint was completed yet, so the run restarts from its first step")


def engine_failure_message(what: str, exc: BaseException, run_dir: Path, ckpt_dir: Path) -> str:
    """The rollout engines gave up (restarts used up, weights not delivered): stop rather than train on."""
    return (f"the rollout engines failed during {what} ({type(exc).__name__}: {_first_line(exc)}); "
            f"{_checkpoint_sentence(ckpt_dir)}. Engine logs: {run_dir / 'engine_logs'}. "
            f"Resume with: {resume_command(run_dir)}")


def actor_failure_message(what: str, exc: BaseException, run_dir: Path, ckpt_dir: Path) -> str:
    """One paragraph: what died during what, the last intact checkpoint, the resume command."""
    where = _checkpoint_sentence(ckpt_dir)
    memory = (" Ray's memory monitor killed a worker: the machine ran low on memory; free some (or lower "
              "rollout.threads / train.threads) before resuming." if isinstance(exc, ray.exceptions.OutOfMemoryError)
              or "low on memory" in str(exc) else "")
    return f"a Ray actor died during {what} ({_describe(exc)}); {where}.{memory} Resume with: {resume_command(run_dir)}"


def _describe(exc: BaseException) -> str:
    """`Class: first line`; for an error passed on by another actor (a manager whose engine died), the
    original error and the method it surfaced in instead of Ray's colored task header."""
    cause = vars(exc).get("cause") if isinstance(exc, ray.exceptions.RayTaskError) else None
    if isinstance(cause, BaseException):
        method = re.search(r"ray::([\w.]+)\(", _plain(str(exc)))  # Ray's header: ray::Class.method() (pid=...)
        return f"{type(cause).__name__}{' in ' + method.group(1) if method else ''}: {_first_line(cause)}"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colors its task headers


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in _plain(str(exc)).splitlines() if line.strip()]
    return lines[0][:300] if lines else "no details"


def report_engine_restarts(row: dict[str, Any], run_dir: Path) -> None:
    """Take the restart events out of a step's rollout metrics, print each on the console and append them to
    `engine_events.jsonl`: the restarts happen in the rollout manager actor, whose log the driver does not
    show (log_to_driver=False), so without this a restarted engine left no trace in the run."""
    events = row.pop(ENGINE_EVENTS_KEY, None) or []
    if not events:
        return
    for event in events:
        tqdm.write(engine_event_line(event), file=sys.stdout)  # above the progress bar, not through it
    sys.stdout.flush()
    append_engine_events(run_dir, events)


def _prune_checkpoints(directory: Path, keep: int = KEEP_CHECKPOINTS) -> None:
    iters = sorted(p for p in directory.glob("iter_*") if p.is_dir())
    latest = (directory / "latest").read_text().strip() if (directory / "latest").exists() else None
    for old in iters[:-keep]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def _final_evaluations(method: Any, final_hf: Path, warm_dir: Path, run_dir: Path, eval_rows: list[dict]) -> None:
    """A method's final evaluations with in-process engines: run in a Ray worker (`off_driver.run_in_worker`)."""
    from slime_ext.engine.embedded import EmbeddedEngine

    method.final_evaluations(final_hf, warm_dir, run_dir, eval_rows, EmbeddedEngine.from_pretrained)


def _peak_rss_gib() -> float:
    """Resident memory of this process and every Ray worker process of this machine (GiB)."""
    import psutil

    total = psutil.Process().memory_info().rss
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
            if "ray::" in cmd or "ray::" in (proc.info.get("name") or ""):
                total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**30


class TrainingJob:
    """The sft / rl / eval stages of the main job (one object per run directory).

    One method object per run, in one place at a time. The job builds it; the driver asks it the run's
    fixed facts before RL (name, SFT warm start rows and key, the setup loss spec, partner and KL reference
    checkpoints, its evaluation options). `run_rl` then hands it to the rollout manager (the same object
    in-process; pickled into the actor with `rollout.manager: actor`, after which the driver keeps no copy;
    the actor starts beside the trainer's ranks), evaluates the warm start with the options taken, and
    during RL the driver reaches it only through the manager: the step's loss spec with the rollout,
    `update`, `state_dict` / `load_state_dict`, `evaluate_after_step` (run where the method lives, with the
    manager's engine). When the steps are done the manager hands it back
    (`release_method`, with its final state) for the final evaluations in the driver. So every hook sees
    the controllers' state that made the rollouts, never a stale copy's.
    """

    def __init__(self, config: Config, run_dir: Path, train_rows: list[dict], eval_rows: list[dict], tokenizer: Any,
                 tokenizer_path: Path):
        if config.model.hf_path and not (Path(config.model.hf_path) / "config.json").is_file():
            raise FileNotFoundError(f"model.hf_path={config.model.hf_path}: no config.json there (not an HF checkpoint)")
        self.cfg = config
        self.run_dir = run_dir
        self.train_rows = train_rows
        self.eval_rows = eval_rows
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path
        self.hf_config = hf_config_from_model_config(config.model, len(tokenizer))
        self.sizes = ParallelSizes.from_config(config.train.parallel)
        self.peak_gib: Optional[float] = None  # GiB; None until a step measured it (or a resumed run's rows did)
        self.sft_report: Optional[LoadReport] = None  # set when the SFT rows are built
        self._method: Optional[Method] = build_run_method(config, tokenizer)  # None while the manager holds it
        self._eval_hooks: Optional[tuple[dict[str, Any], dict[str, Any]]] = None
        self.method_name = self._method.name
        self.actors = actor_groups(config)
        self._sft_group: Optional[TrainGroup] = None  # the SFT stage's ranks, kept for the RL stage

    @property
    def method(self) -> Method:
        """The run's one method object, while the driver holds it (not during RL: see the class docstring)."""
        if self._method is None:
            raise RuntimeError("the rollout manager holds the method during RL: ask it through the manager")
        return self._method

    @method.setter
    def method(self, method: Method) -> None:
        self._method = method

    # -- SFT warm start ---------------------------------------------------------------------------
    def warm_start_key(self) -> str:
        """The SFT warm start's cache key: what determines its rows and training (the data settings and the row
        transform the method's section asks for, e.g. SxS's `sxs.interleave_data`, included)."""
        c = self.cfg
        parts = [WARM_FORMAT, c.model.model_dump(), c.sft.model_dump(), c.data.cache_fields(),
                 self.method.warm_start_key(),
                 str(self.tokenizer_path), self.sft_seed, c.train.micro_batch_size, c.rollout.max_prompt_len,
                 c.rollout.max_response_len, transform_key(data_transform(c))]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def sft_seed(self) -> int:
        return self.cfg.sft.seed if self.cfg.sft.seed is not None else self.cfg.run.seed

    def sft_rows(self) -> list[dict]:
        """The warm start's rows: the training data, or what the method trains its warm start on, without
        the rows too long for the prompt limit or the model's context (counted in `sft_report`)."""
        rows = self.method.warm_start_rows(self.train_rows, self.sft_seed)
        self.sft_report = LoadReport(path="SFT rows", n_rows_ok=len(rows))
        limits = LengthLimits.from_config(self.cfg, sft=True)
        return drop_too_long(rows, self.tokenizer, self.cfg.data.template, limits, self.sft_report)

    def warm_start_dir(self) -> Path:
        return Path(self.cfg.run.cache_dir) / "warmstart" / self.warm_start_key()

    def run_sft(self) -> Path:
        """SFT (from random init, or from `model.hf_path`) on the reference solutions; cached by content hash
        (and resumable). A checkpoint is used as it is when `sft.steps` is 0 or `run.stages` lists no `sft`."""
        base = Path(self.cfg.model.hf_path) if self.cfg.model.hf_path else None
        if base is not None and (self.cfg.sft.steps == 0 or "sft" not in self.cfg.run.stages):
            log.info("starting from the checkpoint %s as it is (no SFT)", base)
            return base
        out = self.warm_start_dir()
        hf_dir = out / "hf"
        if (out / MARKER).exists():
            log.info("SFT warm start found in cache: %s (skipping SFT)", hf_dir)
            return hf_dir
        s = self.cfg.sft
        out.mkdir(parents=True, exist_ok=True)
        init_ray(self.cfg)
        group = self.train_group(threads=sft_threads_per_rank(self.cfg, self.actors["train"].count))
        settings = trainer_settings(self.cfg, self.method.loss_spec(), total_steps=s.steps, lr=s.lr)
        settings.lr_warmup_steps = s.warmup_steps
        settings.seed = self.sft_seed
        settings.lr_decay_style = s.lr_decay_style
        settings.min_lr = s.lr * s.min_lr_ratio
        try:
            with stop_on_actor_failure("the SFT warm start", self.run_dir, out / "trainer_ckpt"):
                self._sft_steps(group, settings, base, out)
                group.export_hf_sharded(hf_dir, self.hf_config)  # shard by shard from the ranks
            if "rl" in self.cfg.run.stages:  # the RL stage sets its trainer up on these ranks: no second start
                group.call("release_trainer")  # its memory is free before the RL stage's engines start
                self._sft_group, group = group, None
        finally:
            if group is not None:
                group.shutdown()
        self.tokenizer.save_pretrained(hf_dir)
        shutil.rmtree(out / "trainer_ckpt", ignore_errors=True)
        write_marker(out, s.steps)
        log.info("SFT warm start saved to %s", hf_dir)
        return hf_dir

    def _sft_steps(self, group: TrainGroup, settings: TrainerSettings, base: Optional[Path], out: Path) -> None:
        """Run (or resume) the SFT steps on the rank actors."""
        s = self.cfg.sft
        group.setup(self.hf_config, settings, self.sizes, self.tokenizer.pad_token_id, hf_dir=base)
        data = DataSource(self.sft_rows(), self.sft_seed + 1, shuffle=True)
        ckpt = out / "trainer_ckpt"
        start = 0
        if (ckpt / "latest").exists():
            start = group.first("load", str(ckpt))["step"]
            data.load_state_dict(json.loads((out / "data_state.json").read_text()))
            log.info("resuming SFT at step %d from %s", start, ckpt)
        max_len = self.cfg.rollout.max_prompt_len + self.cfg.rollout.max_response_len
        bar = tqdm(range(start, s.steps), desc="SFT warm start", unit="step", file=sys.stderr, initial=start, total=s.steps)
        metrics_path = out / "sft_metrics.jsonl"
        truncate_metrics(metrics_path, start)  # the rows after the checkpoint are about to be written again
        for step in bar:
            batch = sft_samples(data.next_batch(s.batch_size), self.tokenizer, self.cfg.data.template, max_len, f"sft{step}-")
            t0 = time.perf_counter()
            m = group.first("train_step", batch, "sft")
            m["step"], m["seconds"] = step, time.perf_counter() - t0
            _append_jsonl(metrics_path, m)
            bar.set_postfix(loss=f"{m['nll']:.3f}", lr=f"{m['lr']:.2e}", tok_s=f"{m['tokens'] / m['seconds']:.0f}")
            if (step + 1) % 100 == 0 and step + 1 < s.steps:
                group.call("save", str(ckpt), {"step": step + 1})
                (out / "data_state.json").write_text(json.dumps(data.state_dict()))

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, engine: Any, name: str) -> Any:
        from slime_ext.evaluation import evaluate, save_report

        cached = self.run_dir / f"eval_{name}.json"
        rows = self.eval_rows[: self.cfg.eval.n_prompts]
        options, tools = self._evaluation_hooks()
        if self.cfg.rollout.env is not None:  # every request an episode, as in the RL rollouts
            from slime_ext.envs.episode_engine import episode_evaluation
            from slime_ext.evaluation import request_row

            engine, options = episode_evaluation(engine, self.cfg.rollout, self.tokenizer,
                                                 lambda rid: rows[request_row(rid)], options, tools)
        report = evaluate(engine, self.tokenizer, rows, self.cfg.eval, reward_type=self.cfg.reward.type,
                          template=self.cfg.data.template, max_new_tokens=self.cfg.rollout.max_response_len,
                          seed=self.cfg.run.seed, progress=True, **options)
        save_report(report, cached)  # aggregates + per-prompt records (eval_<name>.records.jsonl)
        return report

    def _evaluation_hooks(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The method's evaluation options and environment tools, taken while the driver holds the method and
        kept: they come from its config (sampler specs, a projection, response metrics), so the evaluations
        between RL steps (`eval.every`), while the rollout manager holds the method, use the same ones."""
        if self._method is not None:
            self._eval_hooks = (self._method.eval_options(), self._method.env_tools())
        if self._eval_hooks is None:
            raise RuntimeError("evaluation before the method's hooks were taken")
        return self._eval_hooks

    def evaluate_checkpoint(self, hf_dir: Path, name: str) -> Any:
        """Evaluate an HF checkpoint (SFT-only runs have no engine actor): the model lives in an engine actor on
        this node, the evaluation loop here (slime_ext.orchestration.off_driver)."""
        from slime_ext.orchestration.off_driver import checkpoint_engine

        init_ray(self.cfg)
        with checkpoint_engine(hf_dir, self.cfg.rollout.threads) as engine:
            return self.evaluate(engine, name)

    # -- RL ---------------------------------------------------------------------------------------
    def train_group(self, threads: int, wait: bool = True) -> TrainGroup:
        """The trainer's rank actors, placed as `slime_ext.orchestration.placement` says (`wait`: see TrainGroup)."""
        return TrainGroup(self.actors["train"], build_placement(self.cfg), threads=threads,
                          bucket_mb=self.cfg.sglang.weight_bucket_mb, wait=wait)

    def rl_train_group(self) -> TrainGroup:
        """The RL stage's ranks: the SFT stage's of this job when it ran (each rank's process start is mostly
        imports, ~10 s on a 2-core machine; `setup` builds a new trainer and re-seeds), else new ones, returned
        while they start."""
        group, self._sft_group = self._sft_group, None
        if group is None:
            return self.train_group(threads=self.cfg.train.threads, wait=False)
        group.call("set_threads", self.cfg.train.threads)
        return group

    def close(self) -> None:
        """End the SFT stage's ranks if no RL stage took them."""
        if self._sft_group is not None:
            self._sft_group.shutdown()
            self._sft_group = None

    def run_rl(self, warm_dir: Path, with_eval: bool) -> dict[str, Any]:
        cfg = self.cfg
        init_ray(cfg)
        ckpt_dir = self.run_dir / "checkpoints"
        partner = self.method.partner_dir(warm_dir) if type(self.method).holds_partner(cfg) else None
        group: Optional[TrainGroup] = None
        manager_actor = None
        manager: Any = None
        run_engine = None
        scoring = None
        try:
            # The engines, the trainer's ranks and the rollout manager start side by side (each process start is
            # mostly imports, an engine server's also its model load): nothing below waits for one before the
            # next is started, except the manager, which is handed the ready engine.
            with self._stopping("the engines' start", ckpt_dir):
                run_engine = start_engine(cfg, self.actors["engine"], warm_dir, partner, self.run_dir, self.tokenizer)
                servers = type(self.method).scoring_servers(cfg)
                if servers is not None:  # e.g. a distillation teacher on engine servers of its own
                    checkpoint_with_vocabulary(servers.checkpoint, self.tokenizer, servers.key)
                    scoring = start_scoring_servers(cfg, self.actors["scoring"], servers, self.run_dir)
            with self._stopping("the trainer's setup", ckpt_dir):
                group = self.rl_train_group()
            with self._stopping("the engines' start", ckpt_dir):
                engine = run_engine.engine
                # a restarted engine is brought current by the ranks: attached before the manager takes its copy
                engine.attach_weight_source(group)
            # what the trainer's setup asks of the method, taken before the method moves to the manager
            loss_spec, kl_reference = self.method.loss_spec(), self.method.kl_reference_dir(warm_dir)
            with self._stopping("the rollout manager's start", ckpt_dir):
                manager, manager_actor = self._start_rollout_manager(  # the method moves to the manager
                    engine, scoring.engine if scoring is not None else None)
            with self._stopping("the trainer's setup", ckpt_dir):
                group.wait_started()
                self._setup_trainer(group, warm_dir, loss_spec, kl_reference)
                if adapter_name(cfg):  # the engines hold the base; every request names the adapter from now on
                    engine.sync_weights(group, INITIAL_VERSION)
            with self._stopping("the warm start evaluation", ckpt_dir):
                reports = self._warm_start_report(engine, with_eval, resuming=(ckpt_dir / "latest").exists())
            with self._stopping("the rollout manager's start and the resume", ckpt_dir):
                if manager is None:  # the actor's handle: waits for its start
                    manager = RemoteRolloutManager(manager_actor)
                if cfg.rollout.asynchronous:  # rollouts beside training (slime_ext.orchestration.async_rollouts)
                    manager = async_rollouts(cfg, manager, engine)
                start = self._resume(group, manager, engine, ckpt_dir)
            self._rl_loop(start, manager, group, engine, ckpt_dir)
            with self._stopping("the final weight export and evaluation", ckpt_dir):
                self.method = manager.release_method()  # back from the manager, with its final state
                reports.update(self._finish(group, engine, warm_dir, with_eval))
        finally:
            if group is not None:
                group.shutdown()
            if run_engine is not None:
                run_engine.shutdown()
            if scoring is not None:
                scoring.shutdown()
            if isinstance(manager, AsyncRollouts):  # its producer thread stops before the manager's actor goes
                manager.close(timeout=10.0)
            if manager_actor is not None:
                ray.kill(manager_actor)
        return reports

    def _stopping(self, what: str, ckpt_dir: Path) -> Any:
        return stop_on_actor_failure(what, self.run_dir, ckpt_dir)

    def _setup_trainer(self, group: TrainGroup, warm_dir: Path, loss_spec: LossSpec, reference: Optional[Path]) -> None:
        """The ranks' trainers from the warm start, with the method's loss spec and KL reference (`reference`:
        None for the starting checkpoint; Tandem's KL-Reg names the junior)."""
        settings = trainer_settings(self.cfg, loss_spec)
        self.kl_active = settings.loss.kl_coef > 0
        group.setup(self.hf_config, settings, self.sizes, self.tokenizer.pad_token_id, warm_dir)
        if self.kl_active:
            if reference is not None:
                group.call("load_hf", str(reference))
                group.call("snapshot_reference")
                group.call("load_hf", str(warm_dir))
            else:
                group.call("snapshot_reference")
        group.set_weights_version(INITIAL_VERSION)  # the warm start the engines were started with

    def _start_rollout_manager(self, engine: Any, scorer: Optional[Any] = None
                               ) -> tuple[Optional[RolloutManager], Any]:
        """The rollout manager in this process (and None), or (None and) its actor, started and not waited for:
        `RemoteRolloutManager(actor)` waits. The method moves to it: `self.method` is None until the manager's
        `release_method` hands it back."""
        cfg = self.cfg
        self._evaluation_hooks()  # kept for the evaluations before and between steps
        method, self._method = self.method, None
        if cfg.rollout.manager != "actor":
            return RolloutManager(cfg, self.train_rows, self.tokenizer, engine, method=method, scorer=scorer), None
        # partial rollouts: pause/resume around a weight sync reach the manager while its rollout runs
        concurrency = {"max_concurrency": 2} if cfg.rollout.partial_rollouts else {}
        # on the driver's node (the plan's head node): the method's `solver:` endpoints are this process's
        # servers on 127.0.0.1 (slime_ext.orchestration.local_endpoints)
        here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                             soft=False)
        actor = ray.remote(RolloutManager).options(
            **ray_options(self.actors["manager"]), **concurrency, scheduling_strategy=here,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
        ).remote(cfg, self.train_rows, self.tokenizer, engine, method, scorer)
        return None, actor

    def _resume(self, group: Any, manager: Any, engine: Any, ckpt_dir: Path) -> int:
        """The step to start at (0 without a checkpoint), with trainer, manager and engine restored and
        `metrics.jsonl` cut to the steps before it: also when no checkpoint exists yet, since a run killed
        after step 0's row but before the first checkpoint starts again at 0. The peak RSS starts from
        the kept rows' measurements."""
        metrics_path = self.run_dir / "metrics.jsonl"
        start = 0
        if (ckpt_dir / "latest").exists():  # a stale marker (its iteration gone) is an error in load, not a restart
            extra = group.first("load", str(ckpt_dir))
            start = extra["step"]
            manager.load_state_dict(extra["manager"])
            engine.sync_weights(group, start)  # step `start` rolls out with version `start`
            log.info("resumed RL at step %d from %s", start, ckpt_dir)
        elif hasattr(engine, "verify_refit") and not adapter_name(self.cfg):
            # engine servers: the first sync checked bit for bit (weights_checker); with adapter sync the engines
            # keep the base they loaded and get the adapter alone, so there is no full sync to check
            checked = engine.verify_refit(group, INITIAL_VERSION)
            log.info("first weight sync verified on every engine: snapshot, reset, sync, compare (push %.1f s)",
                     checked.get("time/sync_push", 0.0))
        if isinstance(manager, AsyncRollouts):  # rollouts numbered from here unless a queue was restored
            manager.resume_at(start)
        truncate_metrics(metrics_path, start)
        self.peak_gib = peak_rss_from_metrics(metrics_path)
        return start

    def _warm_start_report(self, engine: Any, with_eval: bool, resuming: bool) -> dict[str, Any]:
        """The warm start's evaluation: run before step 0, read back from `eval_warm_start.json` on resume; none
        with `eval.warm_start: false`."""
        warm_eval = self.run_dir / "eval_warm_start.json"
        with_eval = with_eval and self.cfg.eval.warm_start
        if with_eval and not resuming:
            return {"warm start (SFT)": self.evaluate(engine, "warm_start")}
        if with_eval and warm_eval.exists():
            from slime_ext.evaluation import load_report

            return {"warm start (SFT)": load_report(warm_eval)}
        return {}

    def _rl_loop(self, start: int, manager: Any, group: Any, engine: Any, ckpt_dir: Path) -> None:
        """Steps `start` .. train.steps - 1: a metrics row each, a checkpoint every `run.save_every`."""
        cfg = self.cfg
        bar = tqdm(range(start, cfg.train.steps), desc=f"{self.method_name} RL", unit="step", file=sys.stderr,
                   initial=start, total=cfg.train.steps)
        with RunLogger(self.run_dir, cfg.logging, cfg.run.log_every, start_step=start, run_name=self.run_dir.name,
                       config=cfg.model_dump(mode="json")) as run_logger:
            for step in bar:
                with self._stopping(f"step {step}", ckpt_dir):
                    # off-policy: the wrapper is the step's engine too (its sync finishes the rollout in flight)
                    row = self._rl_step(step, manager, group, manager if isinstance(manager, AsyncRollouts) else engine)
                    run_logger.log(row)  # metrics.jsonl, TensorBoard, W&B
                    manager.evaluate_after_step(row, self.run_dir)  # where the method lives, with its engine
                bar.set_postfix(reward=f"{row['reward/mean']:.3f}", len=f"{row['response_len/mean']:.0f}",
                                tok_s=f"{row['perf/tokens_per_s']:.0f}")
                done = step + 1
                if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.train.steps:
                    # before the checkpoint: a run killed during it redoes the step and then this evaluation
                    with self._stopping(f"the evaluation after step {step}", ckpt_dir):
                        self.evaluate(engine, f"step{done}")
                if done % cfg.run.save_every == 0 or done == cfg.train.steps:
                    with self._stopping(f"the checkpoint save after step {step}", ckpt_dir):
                        group.call("save", str(ckpt_dir), {"step": step + 1, "manager": manager.state_dict()})
                    _prune_checkpoints(ckpt_dir)

    def _finish(self, group: TrainGroup, engine: Any, warm_dir: Path, with_eval: bool) -> dict[str, Any]:
        """Final HF weights, the final evaluation and the method's own final evaluations."""
        final_hf = self.run_dir / "hf"
        group.export_hf_sharded(final_hf, self.hf_config)  # written by the ranks that hold the weights
        self.tokenizer.save_pretrained(final_hf)
        if self.cfg.train.lora.rank:  # beside the merged model, the adapter alone (PEFT), base = the warm start
            group.call("export_lora_adapter", str(final_hf / "lora"), str(warm_dir))
        if not with_eval:
            return {}
        from slime_ext.orchestration.off_driver import run_in_worker

        reports = {self.method.name.upper(): self.evaluate(engine, "final")}
        # the method's own evaluations load whole models: in a worker on this node, not in the driver
        run_in_worker(_final_evaluations, self.method, final_hf, warm_dir, self.run_dir, self.eval_rows,
                      threads=self.cfg.rollout.threads)
        return reports

    def _check_consistency(self, group: TrainGroup, samples: list[Sample]) -> dict[str, float]:
        """Before the first update: the trainer's logprobs on the first batch against the engine's."""
        from slime_ext.orchestration.consistency import check_consistency, consistency_report

        trainer = group.first("compute_logprobs", samples)["logprobs"]
        metrics = check_consistency(consistency_report(samples, trainer), self.cfg)
        log.info("step-0 consistency check passed: mean |logp_trainer - logp_engine| = %.3g (tolerance %.3g)",
                 metrics["consistency/abs_diff_mean"], metrics["consistency/tolerance"])
        return metrics

    def _rl_step(self, step: int, manager: RolloutManager | RemoteRolloutManager, group: TrainGroup,
                 engine: Any) -> dict:
        t_start = time.perf_counter()
        sleep = colocated_sleep(self.cfg) and hasattr(engine, "sleep")  # engine servers sharing the trainer's GPUs
        offloaded = sum(group.call("offload")) if sleep else 0  # the trainer leaves the GPU to the engines
        groups, row = manager.rollout(step)
        loss = manager.loss_spec()  # the method's loss for this batch: it goes to the trainer with the batch
        report_engine_restarts(row, self.run_dir)
        if sleep:  # the engines release weights and KV cache; the trainer comes back
            row.update(engine.sleep())
            row["memory/trainer_offloaded_bytes"] = float(offloaded)
            group.call("onload")
        samples = [s for g in groups for s in g]
        if step == 0 and self.cfg.train.check_consistency_at_start:
            row.update(self._check_consistency(group, samples))
        t0 = time.perf_counter()
        ref = group.first("compute_logprobs", samples, True) if self.kl_active else None
        train = group.first("train_step", samples, manager.train_kind, ref["logprobs"] if ref else None, loss)
        t1 = time.perf_counter()
        if sleep:
            engine.wake_weights()  # weights first: the sync writes into them
        sync = engine.sync_weights(group, step + 1)  # the ranks push; step + 1 rolls out with version step + 1
        if sleep:
            engine.wake_kv_cache()  # after the sync, so the KV pool is not in its way
        t2 = time.perf_counter()
        row.update(sync)
        row.update(manager.update(train, step))
        row.update({f"train/{k}": v for k, v in train.items()})
        tokens = sum(s.total_len for s in samples)
        self.peak_gib = max(self.peak_gib or 0.0, _peak_rss_gib())
        row.update({"step": step, "time/train": t1 - t0, "time/sync": t2 - t1, "time/step": t2 - t_start,
                    "time/sync_share": (t2 - t1) / max(t2 - t_start, 1e-9),  # the weight sync's share of the step
                    "perf/tokens_per_s": tokens / (t2 - t_start), PEAK_RSS_KEY: self.peak_gib})
        return row

