"""The training loop on Ray: SFT warm start (cached), then RL steps with weight sync, checkpoints, resume.

One RL step (DESIGN.md):
  rollout manager: plan -> engine.generate -> finish (rewards, advantages)
  train group:     (reference logprobs if KL) -> optimizer step
  weight sync:     Megatron -> HF names -> engine update (the engine flushes its prefix cache)
  method.update:   controllers
A checkpoint (trainer ranks + rollout manager state + step) is written every `run.save_every` steps
(default: every step, so a killed run loses at most the step in flight); `metrics.jsonl` is truncated
to the checkpointed step on resume, so the resumed metrics continue the original ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

import ray
from tqdm import tqdm

from megatron_glue.actor import TrainerSettings
from megatron_glue.hf_config import hf_config_from_model_config
from megatron_glue.model_provider import ParallelSizes
from slime_ext.config.schema import Config
from slime_ext.data import Sample
from slime_ext.engine.actor import EmbeddedEngineActor, RemoteEngine
from slime_ext.rollout.data_source import DataSource
from slime_ext.rollout.manager import RemoteRolloutManager, RolloutManager
from slime_ext.tasks.templates import get_template
from slime_ext.train_group import TrainGroup

log = logging.getLogger("slime_ext.loop")
WARM_FORMAT = "warmstart-v1"
KEEP_CHECKPOINTS = 2


def init_ray(config: Config) -> None:
    if ray.is_initialized():
        return
    if config.cluster.ray_address:
        ray.init(address=config.cluster.ray_address, log_to_driver=True)
    else:
        # address="local": always a fresh single-machine instance, never another job's cluster
        ray.init(address="local", num_cpus=max(2, config.rollout.threads + config.train.threads),
                 include_dashboard=False, log_to_driver=False, configure_logging=False)


def world_size(config: Config) -> int:
    p = config.train.parallel
    return p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.data_parallel_size


def sft_samples(rows: list[dict], tokenizer: Any, template: str, max_len: int, prefix: str) -> list[Sample]:
    """Prompt (masked out) + reference solution + EOS (trained) for each row."""
    tmpl = get_template(template)
    out = []
    for i, row in enumerate(rows):
        prompt = tokenizer(tmpl.format(row["prompt"]))["input_ids"]
        response = tokenizer(str(row.get("solution", row["label"])))["input_ids"] + [tokenizer.eos_token_id]
        out.append(Sample(f"{prefix}{i}", prompt, response[: max(1, max_len - len(prompt))]))
    return out


def _append_jsonl(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def _truncate_metrics(path: Path, before_step: int) -> None:
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", -1) < before_step:
                keep.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(k + "\n" for k in keep))


def _prune_checkpoints(directory: Path, keep: int = KEEP_CHECKPOINTS) -> None:
    iters = sorted(p for p in directory.glob("iter_*") if p.is_dir())
    latest = (directory / "latest").read_text().strip() if (directory / "latest").exists() else None
    for old in iters[:-keep]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


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
    """The sft / rl / eval stages of the main job (one object per run directory)."""

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
        self.peak_gib = 0.0

    # -- SFT warm start ---------------------------------------------------------------------------
    def warm_start_key(self) -> str:
        c = self.cfg
        # DA-GRPO's SFT rows depend on the phases' data only (not their order, steps, tau or local_only),
        # so every arm of a study over the same tasks shares one warm start
        dagrpo_data = None
        if c.method in ("dagrpo", "collab_grpo"):
            from slime_ext.methods.dagrpo import phase_data_sources

            dagrpo_data = (phase_data_sources(c), c.dagrpo.trigger, c.dagrpo.sft_trigger_fraction)
        parts = [WARM_FORMAT, c.model.model_dump(), c.sft.model_dump(), c.data.model_dump(), dagrpo_data,
                 str(self.tokenizer_path), self.sft_seed, c.train.micro_batch_size, c.rollout.max_prompt_len,
                 c.rollout.max_response_len]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def sft_seed(self) -> int:
        return self.cfg.sft.seed if self.cfg.sft.seed is not None else self.cfg.run.seed

    def sft_rows(self) -> list[dict]:
        """The warm start's rows: the training data; for DA-GRPO every phase's data, with some solutions
        ending in the help trigger."""
        c = self.cfg
        if c.method not in ("dagrpo", "collab_grpo") or not c.dagrpo.phases:
            return self.train_rows
        from slime_ext.dagrpo.core import with_trigger_examples
        from slime_ext.methods.dagrpo import load_source_rows, phase_data_sources

        rows = [r for source in phase_data_sources(c) for r in load_source_rows(c, source)[0]]
        return with_trigger_examples(rows, c.dagrpo.trigger, c.dagrpo.sft_trigger_fraction, self.sft_seed)

    def warm_start_dir(self) -> Path:
        return Path(self.cfg.run.cache_dir) / "warmstart" / self.warm_start_key()

    def run_sft(self) -> Path:
        """SFT from random init on the reference solutions; cached by content hash (and resumable)."""
        from megatron_glue.checkpoint_io import save_hf_checkpoint

        base = Path(self.cfg.model.hf_path) if self.cfg.model.hf_path else None
        if base is not None and self.cfg.sft.steps == 0:
            return base  # start RL from the given checkpoint as it is
        out = self.warm_start_dir()
        hf_dir = out / "hf"
        if (out / "complete").exists():
            log.info("SFT warm start found in cache: %s (skipping SFT)", hf_dir)
            return hf_dir
        s = self.cfg.sft
        out.mkdir(parents=True, exist_ok=True)
        init_ray(self.cfg)
        group = TrainGroup(world_size(self.cfg), self.cfg.cluster.gpus_per_node,
                           threads=self.cfg.train.threads + self.cfg.rollout.threads)
        settings = TrainerSettings.from_config(self.cfg, total_steps=s.steps, lr=s.lr)
        settings.lr_warmup_steps = s.warmup_steps
        settings.seed = self.sft_seed
        settings.lr_decay_style = "cosine"
        settings.min_lr = s.lr * 0.1
        try:
            weights = self._sft_steps(group, settings, base, out)
        finally:
            group.shutdown()
        save_hf_checkpoint(hf_dir, self.hf_config, weights)
        self.tokenizer.save_pretrained(hf_dir)
        shutil.rmtree(out / "trainer_ckpt", ignore_errors=True)
        (out / "complete").write_text(json.dumps({"steps": s.steps}) + "\n")
        log.info("SFT warm start saved to %s", hf_dir)
        return hf_dir

    def _sft_steps(self, group: TrainGroup, settings: TrainerSettings, base: Optional[Path], out: Path) -> dict:
        """Run (or resume) the SFT steps on the rank actors; return the final HF-named weights."""
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
        return dict(group.export_hf())

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, engine: Any, name: str) -> Any:
        from slime_ext.evaluation import evaluate

        cached = self.run_dir / f"eval_{name}.json"
        rows = self.eval_rows[: self.cfg.eval.n_prompts]
        report = evaluate(engine, self.tokenizer, rows, self.cfg.eval, reward_type=self.cfg.reward.type,
                          template=self.cfg.data.template, max_new_tokens=self.cfg.rollout.max_response_len,
                          seed=self.cfg.run.seed, progress=True, **self.method_eval_options())
        cached.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        return report

    def method_eval_options(self) -> dict[str, Any]:
        """What a method changes in evaluation: SxS scores the visible answer and reports latency; plain
        GRPO reports the same latency metrics for its chain of thought (the SxS study's CoT arm)."""
        from slime_ext.methods import SxS, build_method

        if self.cfg.method == "grpo":
            from slime_ext.sxs.metrics import cot_response_metrics

            return {"response_metrics": lambda result: cot_response_metrics(self.tokenizer, result.output_ids)}
        if self.cfg.method not in ("sxs_sft", "sxs_rl"):
            return {}
        method: SxS = build_method(self.cfg, self.tokenizer)
        return {"sampler_specs": [method.spec], "project": method.project, "response_metrics": method.response_metrics}

    def evaluate_checkpoint(self, hf_dir: Path, name: str) -> Any:
        """Evaluate an HF checkpoint in this process (SFT-only runs have no engine actor)."""
        from slime_ext.engine.embedded import EmbeddedEngine

        return self.evaluate(EmbeddedEngine.from_pretrained(str(hf_dir)), name)

    def evaluate_tandem_axes(self, senior_dir: Path, junior_dir: Path) -> dict:
        """Handoff robustness, drift and legibility of the trained model against the junior."""
        from slime_ext.tandem_eval import survival_plot, tandem_axes

        axes = tandem_axes(str(senior_dir), str(junior_dir), self.tokenizer, self.eval_rows, self.cfg,
                           n_prompts=self.cfg.tandem.eval_prompts, progress=lambda m: log.info("tandem axes: %s", m))
        (self.run_dir / "tandem_axes.json").write_text(json.dumps(axes, indent=2) + "\n")
        (self.run_dir / "plots").mkdir(exist_ok=True)
        survival_plot({self.cfg.method: axes["drift"]}, self.run_dir / "plots" / "drift_survival.png")
        return axes

    def evaluate_phases(self, engine: Any, ended: int) -> dict:
        """DA-GRPO continual evaluation after phase `ended`: every phase's held-out set (greedy local answers,
        the cloud for prompts that ask); then the continual table from all evaluations so far."""
        from slime_ext.methods import build_method

        method = build_method(self.cfg, self.tokenizer)
        out = {}
        for k, phase in enumerate(self.cfg.dagrpo.phases):
            rows = method.phase_rows(k)[1][: self.cfg.eval.n_prompts]
            out[phase.name] = method.evaluate_rows(engine, rows, self.cfg.data.template, seed=self.cfg.run.seed)
            log.info("after phase %d, held-out %s: %s", ended, phase.name, out[phase.name])
        (self.run_dir / f"eval_after_phase_{ended}.json").write_text(json.dumps(out, indent=2) + "\n")
        write_continual_table(self.run_dir, [p.name for p in self.cfg.dagrpo.phases])
        return out

    # -- RL ---------------------------------------------------------------------------------------
    def junior_dir(self, warm_dir: Path) -> Path:
        """Tandem's frozen junior: `tandem.junior_path`, else a copy of the senior's start (self-paired).
        A different junior must share the senior's vocabulary exactly."""
        path = self.cfg.tandem.junior_path
        if not path or self.cfg.method not in ("tandem", "tandem_klreg", "duet_tandem"):
            return warm_dir
        junior = Path(path)
        if not (junior / "config.json").exists():
            raise FileNotFoundError(f"tandem.junior_path={path}: no HF checkpoint there (config.json missing)")
        from sglang_patches.tandem import check_same_vocabulary
        from slime_ext.tokenizer import load_tokenizer

        check_same_vocabulary(self.tokenizer.get_vocab(), load_tokenizer(str(junior)).get_vocab())
        return junior

    def run_rl(self, warm_dir: Path, with_eval: bool) -> dict[str, Any]:
        cfg = self.cfg
        init_ray(cfg)
        ckpt_dir = self.run_dir / "checkpoints"
        metrics_path = self.run_dir / "metrics.jsonl"
        junior = self.junior_dir(warm_dir)
        engine_handle = ray.remote(EmbeddedEngineActor).options(
            num_cpus=0.01, max_concurrency=2,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(cfg.rollout.threads), "OMP_WAIT_POLICY": "PASSIVE"}}
        ).remote(str(warm_dir), cfg.rollout.threads, str(junior) if cfg.method in ("tandem", "duet_tandem") else None)
        engine = RemoteEngine(engine_handle)
        group = TrainGroup(world_size(cfg), cfg.cluster.gpus_per_node, threads=cfg.train.threads)
        settings = TrainerSettings.from_config(cfg)
        self.kl_active = settings.kl_coef > 0
        group.setup(self.hf_config, settings, self.sizes, self.tokenizer.pad_token_id, warm_dir)
        if self.kl_active:
            # The KL reference is the starting checkpoint, or Tandem's junior for the KL-Reg baseline.
            if junior != warm_dir and cfg.method == "tandem_klreg":
                group.call("load_hf", str(junior))
                group.call("snapshot_reference")
                group.call("load_hf", str(warm_dir))
            else:
                group.call("snapshot_reference")
        manager_actor = None
        if cfg.rollout.manager == "actor":
            manager_actor = ray.remote(RolloutManager).options(
                num_cpus=0.01, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
            ).remote(cfg, self.train_rows, self.tokenizer, engine)
            manager = RemoteRolloutManager(manager_actor)
        else:
            manager = RolloutManager(cfg, self.train_rows, self.tokenizer, engine)
        start = 0
        if (ckpt_dir / "latest").exists():
            extra = group.first("load", str(ckpt_dir))
            start = extra["step"]
            manager.load_state_dict(extra["manager"])
            engine.update_weights_from_tensor(group.export_hf())
            _truncate_metrics(metrics_path, start)
            log.info("resumed RL at step %d from %s", start, ckpt_dir)
        reports: dict[str, Any] = {}
        warm_eval = self.run_dir / "eval_warm_start.json"
        if with_eval and start == 0:
            reports["warm start (SFT)"] = self.evaluate(engine, "warm_start")
        elif with_eval and warm_eval.exists():
            from slime_ext.evaluation import EvalReport

            reports["warm start (SFT)"] = EvalReport.from_dict(json.loads(warm_eval.read_text()))
        bar = tqdm(range(start, cfg.train.steps), desc=f"{cfg.method} RL", unit="step", file=sys.stderr,
                   initial=start, total=cfg.train.steps)
        try:
            for step in bar:
                try:
                    row = self._rl_step(step, manager, group, engine)
                except ray.exceptions.RayActorError as exc:
                    saved = (ckpt_dir / "latest").read_text().strip() if (ckpt_dir / "latest").exists() else "none"
                    raise RuntimeError(
                        f"a Ray actor died during step {step} ({exc.__class__.__name__}); the last checkpoint "
                        f"({saved}) is intact: resume with `bash scripts/run.sh resume={self.run_dir}`"
                    ) from exc
                _append_jsonl(metrics_path, row)
                if row.get("dagrpo/phase_end"):
                    self.evaluate_phases(engine, int(row.get("dagrpo/phase", 0)))
                bar.set_postfix(reward=f"{row['reward/mean']:.3f}", len=f"{row['response_len/mean']:.0f}",
                                tok_s=f"{row['perf/tokens_per_s']:.0f}")
                if (step + 1) % cfg.run.save_every == 0 or step + 1 == cfg.train.steps:
                    group.call("save", str(ckpt_dir), {"step": step + 1, "manager": manager.state_dict()})
                    _prune_checkpoints(ckpt_dir)
            final_hf = self.run_dir / "hf"
            from megatron_glue.checkpoint_io import save_hf_checkpoint

            save_hf_checkpoint(final_hf, self.hf_config, dict(group.export_hf()))
            self.tokenizer.save_pretrained(final_hf)
            if with_eval:
                reports[cfg.method.upper()] = self.evaluate(engine, "final")
            if with_eval and cfg.tandem.eval_axes:
                self.evaluate_tandem_axes(final_hf, junior)
        finally:
            group.shutdown()
            ray.kill(engine_handle)
            if manager_actor is not None:
                ray.kill(manager_actor)
        return reports

    def _rl_step(self, step: int, manager: RolloutManager | RemoteRolloutManager, group: TrainGroup,
                 engine: RemoteEngine) -> dict:
        t_start = time.perf_counter()
        groups, row = manager.rollout(step)
        samples = [s for g in groups for s in g]
        t0 = time.perf_counter()
        ref = group.first("compute_logprobs", samples, True) if self.kl_active else None
        train = group.first("train_step", samples, manager.train_kind, ref["logprobs"] if ref else None)
        t1 = time.perf_counter()
        engine.update_weights_from_tensor(group.export_hf())
        t2 = time.perf_counter()
        row.update(manager.update(train, step))
        row.update({f"train/{k}": v for k, v in train.items()})
        tokens = sum(s.total_len for s in samples)
        self.peak_gib = max(self.peak_gib, _peak_rss_gib())
        row.update({"step": step, "time/train": t1 - t0, "time/sync": t2 - t1, "time/step": t2 - t_start,
                    "perf/tokens_per_s": tokens / (t2 - t_start), "memory/peak_rss_gib": self.peak_gib})
        return row


def write_continual_table(run_dir: Path, phases: list[str]) -> Optional[Path]:
    """during-task accuracy (phase k's set right after phase k), post-switch accuracy (after phase k+1),
    forgetting (during - post) / during, local-only and joint accuracy and cloud rate after the last phase."""
    evals = {k: json.loads((run_dir / f"eval_after_phase_{k}.json").read_text())
             for k in range(len(phases)) if (run_dir / f"eval_after_phase_{k}.json").exists()}
    if not evals:
        return None
    last = evals[max(evals)]
    lines = ["| phase | during-task acc | post-switch acc | forgetting | local-only acc (last) | joint acc (last) "
             "| cloud rate (last) | random router (last) | router classifier (last) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, name in enumerate(phases):
        during = evals.get(k, {}).get(name, {}).get("joint_accuracy")
        post = evals.get(k + 1, {}).get(name, {}).get("joint_accuracy")
        forget = (during - post) / during if during and post is not None else None
        cell = lambda v: "-" if v is None or v != v else f"{v:.3f}"  # noqa: E731
        row = last.get(name, {})
        lines.append(f"| {name} | {cell(during)} | {cell(post)} | {cell(forget)} | {cell(row.get('local_only_accuracy'))} "
                     f"| {cell(row.get('joint_accuracy'))} | {cell(row.get('cloud_rate'))} "
                     f"| {cell(row.get('random_router_joint_accuracy'))} | {cell(row.get('router_clf_joint_accuracy'))} |")
    path = run_dir / "continual_table.md"
    path.write_text("\n".join(lines) + "\n")
    return path
