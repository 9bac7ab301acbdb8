"""The main job behind `bash scripts/run.sh [CONFIG] [key=value ...]`.

Runs the configured stages in order and records what ran in the run directory (`summary.json` says
`complete` once every stage has run).

With `model.hf_path` the checkpoint's config.json is the architecture: the trainer, the engine and the
plan build the model from it (`megatron_glue.hf_config.hf_config_from_model_config`). `model.*` values
that differ from it are not used; the job says so in a warning per key and in `summary.json`
(`model_checkpoint`), and a tokenizer with more tokens than the checkpoint embeds is an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tqdm import tqdm

from slime_ext.config import ConfigError, ResolvedConfig, load_config
from slime_ext.orchestration.run_dir import (RunStopped, create_run_dir, finished_run_message, remove_if_unused,
                                             write_json)
from slime_ext.orchestration.warm_start_marker import build_of, check_build
from slime_ext.tasks.dataset import DatasetError
from slime_ext.tasks.prepare import PreparedData, prepare_data

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "grpo.yaml"
log = logging.getLogger("slime_ext")

class CheckpointMismatch(ValueError):
    """The checkpoint at `model.hf_path` cannot serve this run as configured (the message names the key)."""


def checkpoint_model_fields(hf_dir: str | Path) -> dict[str, Any]:
    """The `model.*` values an HF checkpoint's config.json stands for (keys it does not define are left out)."""
    from transformers import AutoConfig

    from megatron_glue.hf_config import HF_MODEL_KEYS  # in the function: importing the driver stays light

    hf = AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
    out: dict[str, Any] = {}
    for key, attr in HF_MODEL_KEYS.items():
        if key == "rope_theta":  # transformers 5 keeps it in rope_parameters
            value = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta", getattr(hf, "rope_theta", None))
        elif key == "num_experts":  # Qwen3-MoE: num_experts (num_local_experts in transformers 5); dense: 0
            value = getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or 0
        else:
            value = getattr(hf, attr, None)
        if value is not None:
            out[key] = value
    return out


def model_fragment(hf_dir: str | Path) -> str:
    """A model config fragment (YAML) that matches an HF checkpoint: what the launcher includes when
    MODEL_CONFIG=checkpoint (scripts/run-qwen3-30B-A3B.sh)."""
    import yaml

    fields = {"name": Path(hf_dir).resolve().name.lower(), **checkpoint_model_fields(hf_dir)}
    header = f"# the model section of {Path(hf_dir).resolve() / 'config.json'}\n"
    return header + yaml.safe_dump({"model": fields}, sort_keys=False)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    return a == b


class Job:
    """State shared by the stages of one run."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path):
        self.resolved = resolved
        self.cfg = resolved.config
        self.run_dir = run_dir
        self.data: PreparedData | None = None
        self.tokenizer: Any = None
        self.tokenizer_path: Path | None = None
        self.warm_dir: Path | None = None
        self.reports: dict[str, Any] = {}
        self.sft_report: Any = None  # the SFT rows' skips (LoadReport), once SFT has built its rows
        self._job: Any = None  # the TrainingJob, built once (its method's config errors surface before SFT)
        self.summary: dict[str, Any] = {"config_files": resolved.files, "overrides": resolved.overrides, "stages": {}}
        # a resumed run must find the warm-start build its first attempt recorded (read before summary.json changes)
        self._earlier_sft_build = self._recorded_build() if self.cfg.run.resume else None

    # -- stages ---------------------------------------------------------------------------------
    def stage_data(self) -> dict:
        from slime_ext.methods.registry import data_transform

        self.data = prepare_data(self.cfg.data, self.cfg.run.cache_dir, data_transform(self.cfg))
        for report in self.data.reports:
            log.info("data: %s", report.summary())
        self._record_skips()
        return self._data_counts()

    def _data_counts(self) -> dict:
        """The data stage's record: rows kept and skipped per file (updated when too-long rows are dropped)."""
        return {
            "train_rows": len(self.data.train),
            "eval_rows": len(self.data.eval),
            "train_path": str(self.data.train_path),
            "skipped": {r.path: r.skipped_by_reason for r in self.data.reports if r.n_skipped},
        }

    def stage_tokenizer(self) -> dict:
        from slime_ext.tasks.templates import get_template
        from slime_ext.tokenizer import build_embedded_tokenizer, load_tokenizer, word_initial_marker

        data = self._need_data()
        tok_cfg = self.cfg.tokenizer
        if tok_cfg.path == "embedded":
            texts = [r["prompt"] + "\n" + str(r.get("solution", r["label"])) for r in data.train[: tok_cfg.n_training_texts]]
            path = build_embedded_tokenizer(Path(self.cfg.run.cache_dir) / "tokenizers", texts, tok_cfg.vocab_size)
        else:
            path = Path(tok_cfg.path)
        self.tokenizer = load_tokenizer(path)
        self.tokenizer_path = Path(path)
        too_long = self._drop_too_long_rows()
        template = get_template(self.cfg.data.template)
        sample = data.eval[:200]
        lengths = [len(self.tokenizer(template.format(r["prompt"]) + str(r.get("solution", r["label"])))["input_ids"]) for r in sample]
        info = {
            "path": str(path),
            "vocab_size": len(self.tokenizer),
            "word_initial_marker": word_initial_marker(self.tokenizer),
            "mean_tokens_prompt_plus_solution": round(statistics.mean(lengths), 1),
            "max_tokens_prompt_plus_solution": max(lengths),
            "too_long_rows": too_long,
        }
        if info["max_tokens_prompt_plus_solution"] > self.cfg.rollout.max_prompt_len + self.cfg.rollout.max_response_len:
            log.warning("some reference solutions are longer than max_prompt_len + max_response_len")
        return info

    def _drop_too_long_rows(self) -> dict[str, int]:
        """Skip train and eval rows whose prompt exceeds rollout.max_prompt_len (counted in the loader's
        reports, like malformed rows); returns how many of each split."""
        from slime_ext.tasks.lengths import LengthLimits, drop_too_long

        data = self._need_data()
        limits = LengthLimits.from_config(self.cfg)
        train_report, eval_report = data.reports[0], data.reports[-1]  # one report when eval is held out
        n_train, n_eval = len(data.train), len(data.eval)
        data.train = drop_too_long(data.train, self.tokenizer, self.cfg.data.template, limits, train_report)
        data.eval = drop_too_long(data.eval, self.tokenizer, self.cfg.data.template, limits, eval_report)
        self._record_skips()
        if "data" in self.summary["stages"]:
            self.summary["stages"]["data"].update(self._data_counts())
        return {"train": n_train - len(data.train), "eval": n_eval - len(data.eval)}

    def _record_skips(self) -> None:
        """`summary.json`'s `skipped_rows`: every skipped row of the run so far (data files, SFT rows), by reason."""
        reports = list(self.data.reports if self.data else []) + ([self.sft_report] if self.sft_report else [])
        total: dict[str, int] = {}
        for report in reports:
            for reason, n in report.skipped_by_reason.items():
                total[reason] = total.get(reason, 0) + n
        self.summary["skipped_rows"] = dict(sorted(total.items()))

    def stage_check_references(self) -> dict:
        """Reference solutions must score 1 and solutions with a wrong final answer must score 0."""
        from slime_ext.rewards import ReasonCounter, get_verifier

        data = self._need_data()
        rows = [r for r in data.eval if "solution" in r]
        if not rows:
            return {"skipped": "the eval rows carry no reference 'solution' field"}
        verify = get_verifier(self.cfg.reward.type)
        good, bad = ReasonCounter(), ReasonCounter()
        n_good = n_bad = 0
        for r in tqdm(rows, desc="check_references", unit="row", file=sys.stderr):
            result = verify(r["solution"], r["label"])
            n_good += result.score == 1.0
            good.add(result)
            wrong = _corrupt_final_answer(r["solution"], r["label"])
            result = verify(wrong, r["label"])
            n_bad += result.score == 0.0
            bad.add(result)
        out = {
            "rows": len(rows),
            "reference_correct": n_good / len(rows),
            "corrupted_scored_zero": n_bad / len(rows),
            "reference_reasons": good.as_dict(),
            "corrupted_reasons": bad.as_dict(),
        }
        if n_good != len(rows) or n_bad != len(rows):
            raise RuntimeError(f"verifier disagrees with the reference solutions: {out}")
        return out

    def _training(self) -> Any:
        """The training job (built once: its method's config errors surface before SFT)."""
        from slime_ext.orchestration.training_job import TrainingJob

        if self._job is None:
            if self.tokenizer is None:
                self.summary["stages"]["tokenizer"] = self.stage_tokenizer()
            self._check_checkpoint()
            data = self._need_data()
            self._job = TrainingJob(self.cfg, self.run_dir, data.train, data.eval, self.tokenizer, self.tokenizer_path)
        return self._job

    def _check_checkpoint(self) -> None:
        """With `model.hf_path`: warn about each `model.*` value the checkpoint overrides (recorded in
        summary.json), and refuse a tokenizer larger than the checkpoint's embedding."""
        hf_path = self.cfg.model.hf_path
        if not hf_path or not (Path(hf_path) / "config.json").is_file():
            return  # no checkpoint, or a missing one (TrainingJob names the path)
        fields = checkpoint_model_fields(hf_path)
        ignored = {}
        for key, value in fields.items():
            ours = getattr(self.cfg.model, key)
            if (key == "vocab_size" and ours is None) or _same(ours, value):
                continue
            source = self.resolved.sources.get(("model", key), "the schema default")
            ignored[key] = {"config": ours, "checkpoint": value, "set_by": source}
            log.warning("model.%s=%r (%s) is not used: %s/config.json says %r, and the checkpoint's architecture wins",
                        key, ours, source, hf_path, value)
        self.summary["model_checkpoint"] = {"hf_path": str(hf_path), "architecture": fields, "ignored_model_keys": ignored}
        n_tokens, vocab = len(self.tokenizer), fields.get("vocab_size")
        if vocab is not None and n_tokens > vocab:
            raise CheckpointMismatch(
                f"tokenizer.path={self.tokenizer_path} has {n_tokens} tokens but the checkpoint model.hf_path={hf_path} "
                f"embeds only vocab_size={vocab} (its config.json): use the checkpoint's own tokenizer "
                f"(tokenizer.path={hf_path})")

    def stage_sft(self) -> dict:
        training = self._training()
        self.warm_dir = training.run_sft()
        self.sft_report = training.sft_report  # None: the warm start came from the cache
        self._record_skips()
        # a resumed RL checkpoint continues from the weights it started with, and its reference must be those too
        check_build(self.warm_dir, self._earlier_sft_build, f"resume={self.run_dir}")
        report = self.sft_report
        return {"warm_start": str(self.warm_dir), "build": build_of(self.warm_dir),
                "skipped_rows": dict(report.skipped_by_reason) if report else {}}

    def _recorded_build(self) -> Optional[str]:
        """The warm-start build id the run's earlier attempt recorded (None before it finished its SFT stage)."""
        path = self.run_dir / "summary.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text()).get("stages", {}).get("sft", {}).get("build")

    def stage_rl(self) -> dict:
        training = self._training()
        if self.warm_dir is None:
            self.warm_dir = training.run_sft()
        self.reports = training.run_rl(self.warm_dir, with_eval="eval" in self.cfg.run.stages)
        peak = training.peak_gib  # None when no step was measured: never a made-up 0.0
        return {"final_weights": str(self.run_dir / "hf"), "peak_rss_gib": None if peak is None else round(peak, 2)}

    def stage_eval(self) -> dict:
        """The final table (warm start vs trained) and the plots of metrics.jsonl."""
        from slime_ext.evaluation import compare_table
        from slime_ext.tools.plots import plot_metrics

        out: dict[str, Any] = {}
        if not self.reports and self.warm_dir is not None and "rl" not in self.cfg.run.stages and self.cfg.eval.warm_start:
            self.reports = {"SFT": self._training().evaluate_checkpoint(self.warm_dir, "sft")}
        if self.reports:
            table = compare_table(self.reports)
            (self.run_dir / "final_table.md").write_text(table + "\n")
            print("\n" + table + "\n", flush=True)
            out["table"] = str(self.run_dir / "final_table.md")
            out["reports"] = {name: r.to_dict() for name, r in self.reports.items()}
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.exists():
            out["plots"] = [str(p) for p in plot_metrics(metrics, self.run_dir / "plots")]
        return out

    # -- driver -----------------------------------------------------------------------------------
    def _need_data(self) -> PreparedData:
        if self.data is None:
            self.summary["stages"]["data"] = self.stage_data()
        return self.data

    def run(self) -> int:
        stages: dict[str, Callable[[], dict]] = {
            "data": self.stage_data,
            "tokenizer": self.stage_tokenizer,
            "check_references": self.stage_check_references,
            "sft": self.stage_sft,
            "rl": self.stage_rl,
            "eval": self.stage_eval,
        }
        finished = finished_run_message(self.run_dir) if self.cfg.run.resume else None
        if finished:  # re-running would repeat the evaluation and overwrite summary.json
            log.warning("%s", finished)
            return 0
        from slime_ext.engine.weight_sync import PeakRSS

        try:
            for name in self.cfg.run.stages:
                start = time.perf_counter()
                with PeakRSS(interval_s=0.05) as peak:  # the driver holds no model: what each stage adds to it
                    result = stages[name]()
                result["seconds"] = round(time.perf_counter() - start, 2)
                result["driver_rss_growth_bytes"] = peak.growth()
                memory = self.summary.setdefault("driver_memory", {"peak_rss_bytes": 0, "stage_growth_bytes": {}})
                memory["stage_growth_bytes"][name] = peak.growth()
                memory["peak_rss_bytes"] = max(memory["peak_rss_bytes"], peak.peak)
                self.summary["stages"][name] = result
                log.info("stage %-16s done in %.1fs: %s", name, result["seconds"], _short(result))
                write_json(self.run_dir / "summary.json", self.summary)
        finally:
            if self._job is not None:
                self._job.close()  # ranks the SFT stage kept for an RL stage that did not run
        self.summary["complete"] = True
        write_json(self.run_dir / "summary.json", self.summary)
        log.info("run directory: %s", self.run_dir)
        return 0


def _corrupt_final_answer(solution: str, label: str) -> str:
    marker = "\\boxed{"
    head, _, _ = solution.rpartition(marker)
    try:
        wrong = str(int(label) + 1)
    except ValueError:
        wrong = label + "1"
    return f"{head}{marker}{wrong}}}"


def _short(result: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, (dict, list)) and k != "seconds")


def parse_args(argv: list[str]) -> tuple[Path, list[str]]:
    """[CONFIG.yaml] [key=value ...]; `resume=RUN_DIR` continues a run with that run's resolved config."""
    parser = argparse.ArgumentParser(prog="scripts/run.sh", description="Run the main job.")
    parser.add_argument("args", nargs="*", help="[CONFIG.yaml] [key=value ...] [resume=RUN_DIR]")
    ns = parser.parse_args(argv)
    args = list(ns.args)
    config = DEFAULT_CONFIG
    if args and "=" not in args[0]:
        config = Path(args.pop(0))
    resume = [a for a in args if a.startswith("resume=") or a.startswith("run.resume=")]
    if resume:
        run_dir = Path(resume[-1].split("=", 1)[1])
        if not (run_dir / "config.yaml").is_file():
            raise SystemExit(f"error: resume={run_dir}: not a run directory (no config.yaml)")
        config = run_dir / "config.yaml"
        args = [a for a in args if a not in resume] + [f"run.resume={run_dir}"]
    return config, args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    config, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        resolved = load_config(config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from slime_ext.engine.sync_requirements import missing_sync_package

    missing = missing_sync_package(resolved.config)
    if missing:  # before any stage runs: the first sync comes only after data, tokenizer and SFT
        print(f"error: {missing}", file=sys.stderr)
        return 2
    run_dir = create_run_dir(resolved)
    log.info("config %s (%s) -> %s", config, resolved.describe(), run_dir)
    try:
        return Job(resolved, run_dir).run()
    except (DatasetError, CheckpointMismatch) as exc:
        # The data (or the checkpoint) cannot be used as it is: the message says which file and why; a
        # traceback adds nothing, and a run directory holding only the config of a run that never started
        # is clutter.
        print(f"error: {exc}", file=sys.stderr)
        if not resolved.config.run.resume:
            remove_if_unused(run_dir)
        return 1
    except KeyboardInterrupt:
        log.warning("interrupted; the last checkpoint is kept. Resume with: bash scripts/run.sh resume=%s", run_dir)
        return 130
    except RunStopped as exc:  # a dead actor: the message says what to do, Ray's traceback would bury it
        log.error("run stopped: %s", exc)
        return 1
    finally:
        _shutdown_ray()


def _shutdown_ray() -> None:
    """End every Ray actor and engine process this job started (also on Ctrl-C and errors)."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
