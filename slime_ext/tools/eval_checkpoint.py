"""Evaluate a checkpoint on held-out prompts: `python -m slime_ext.tools.eval_checkpoint PATH [options] [key=value ...]`.

PATH is either
- an HF checkpoint directory: `config.json` plus weights (`*.safetensors` or `pytorch_model*.bin`) and
  tokenizer files; or
- a run directory (it holds `config.yaml`): the checkpoint evaluated is the newest directory under it
  (searched recursively, e.g. `hf/` or `checkpoints/step_000100/hf`) whose name starts with `hf` and
  that contains a `config.json`; "newest" = latest modification time of that `config.json`, ties broken
  by the larger path.

Config (eval settings, template, reward, max response length, data): `--config FILE` if given, else the
run directory's `config.yaml` (for a checkpoint PATH: the `config.yaml` of the nearest of its three
closest ancestor directories that has one), else `configs/grpo.yaml`; `key=value` overrides apply on top.
Held-out rows: `--data FILE.jsonl` (the config's prompt/label keys), else the eval split the main job uses
(`prepare_data(cfg.data, cfg.run.cache_dir).eval`).

The evaluation is the run's: the configured method's evaluation options apply as in its training job (SxS: the
channel sampler, the visible answer scored, the latency metrics in `meta.response_metrics`), so a checkpoint scores
here what its run's `eval_*.json` would.
Prints a markdown table (and, with `--baseline eval.json`, the comparison with an earlier evaluation) and
writes `eval.json` (and its per-prompt records, `eval.records.jsonl`, which make `--baseline` comparisons paired)
into the checkpoint directory, or to `--out` (a `.json` file, or a directory).
A registered method may add its own evaluation of the checkpoint as an option (`--tandem-junior HF_DIR`,
`--dagrpo-ask-samples K`; `--help` lists them); `--skip-eval` runs only those, not the held-out evaluation.
Exit status: 0 on success, 2 when PATH, the config, the data or a method evaluation's argument cannot be used (the
message names it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from slime_ext.config import ConfigError, ResolvedConfig, load_config
from slime_ext.evaluation import compare_table, evaluate, load_report, make_verifier, request_row, save_report
from slime_ext.methods import registry

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "grpo.yaml"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
log = logging.getLogger("slime_ext.tools.eval_checkpoint")


class EvalError(ValueError):
    """PATH, config or data that the evaluation cannot use."""


def is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(
        next(path.glob(p), None) is not None for p in WEIGHT_PATTERNS)


def find_checkpoint(path: str | Path) -> tuple[Path, Optional[Path]]:
    """(HF checkpoint dir, run dir or None) for PATH; see the module docstring for the rule."""
    p = Path(path)
    if not p.exists():
        raise EvalError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise EvalError(f"{p}: not a directory (expected an HF checkpoint directory or a run directory)")
    if is_checkpoint_dir(p):
        run_dir = next((a for a in list(p.resolve().parents)[:3] if (a / "config.yaml").is_file()), None)
        return p, run_dir
    if (p / "config.yaml").is_file():
        candidates = [d for d in p.rglob("hf*") if d.is_dir() and (d / "config.json").is_file()]
        if not candidates:
            raise EvalError(f"{p}: run directory without a checkpoint (no directory named hf* holding a "
                            f"config.json under it)")
        best = max(candidates, key=lambda d: ((d / "config.json").stat().st_mtime, str(d)))
        if not is_checkpoint_dir(best):
            raise EvalError(f"{best}: checkpoint directory has config.json but no weights ({', '.join(WEIGHT_PATTERNS)})")
        return best, p
    if (p / "config.json").is_file():
        raise EvalError(f"{p}: has config.json but no weights ({', '.join(WEIGHT_PATTERNS)}); not an HF checkpoint")
    raise EvalError(f"{p}: neither an HF checkpoint directory (config.json + weights) nor a run directory "
                    f"(config.yaml)")


def resolve_config(config: Optional[str], run_dir: Optional[Path], overrides: Sequence[str]) -> ResolvedConfig:
    if config:
        path = Path(config)
    elif run_dir is not None:
        path = run_dir / "config.yaml"
    else:
        path = DEFAULT_CONFIG
    log.info("config: %s", path)
    return load_config(path, overrides)


def load_rows(cfg, data: Optional[str]) -> list[dict]:
    from slime_ext.tasks.dataset import load_jsonl

    if data:
        rows, _ = load_jsonl(data, prompt_key=cfg.data.prompt_key, label_key=cfg.data.label_key,
                             max_bad_fraction=cfg.data.max_bad_fraction)
        return rows
    from slime_ext.tasks.prepare import prepare_data

    from slime_ext.methods.registry import data_transform

    return prepare_data(cfg.data, cfg.run.cache_dir, data_transform(cfg)).eval


def _out_path(out: Optional[str], ckpt: Path) -> Path:
    if not out:
        return ckpt / "eval.json"
    p = Path(out)
    if p.suffix == ".json":
        p.parent.mkdir(parents=True, exist_ok=True)
        return p
    p.mkdir(parents=True, exist_ok=True)
    return p / "eval.json"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m slime_ext.tools.eval_checkpoint", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="HF checkpoint directory or run directory")
    ap.add_argument("overrides", nargs="*", help="config overrides key.path=value")
    ap.add_argument("--config", help="config file (default: the run's config.yaml, else configs/grpo.yaml)")
    ap.add_argument("--data", help="held-out JSONL (default: the config's eval split)")
    ap.add_argument("--out", help="where to write eval.json (a .json path or a directory)")
    ap.add_argument("--name", help="row label in the printed table (default: the checkpoint path)")
    ap.add_argument("--baseline", help="an earlier eval.json to compare with (printed first, delta = this - it)")
    ap.add_argument("--batch-prompts", type=int, default=64, help="prompts per generate call (default 64)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--skip-eval", action="store_true",
                    help="only the method evaluations named by their options below, not the held-out evaluation")
    for name, path in registry.checkpoint_evaluations().items():  # the methods' extra evaluations
        ap.add_argument(f"--{name}", metavar="ARG", dest=_dest(name),
                        help=f"also run the evaluation a registered method adds ({path}) with this argument")
    return ap


def _dest(flag: str) -> str:
    return "extra_" + flag.replace("-", "_")


def held_out_evaluation(args: argparse.Namespace, ckpt: Path, tokenizer, rows: list[dict], resolved: ResolvedConfig,
                        baseline, out: Path) -> None:
    """The generic evaluation of the held-out rows: printed as a table (beside `baseline`) and saved to `out`."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.orchestration.local_endpoints import build_run_method

    cfg = resolved.config
    engine = EmbeddedEngine.from_pretrained(str(ckpt))
    # the run's method evaluates as in its training job: its sampler specs, the projection it scores (SxS: the
    # visible answer) and its per-response metrics; the tools it lends to a multi-turn run's environment
    method = build_run_method(cfg, tokenizer)
    options = method.eval_options()
    if cfg.rollout.env is not None:  # a multi-turn run: every request an episode of its environment
        from slime_ext.envs.episode_engine import episode_evaluation

        engine, options = episode_evaluation(engine, cfg.rollout, tokenizer, lambda rid: rows[request_row(rid)],
                                             options, method.env_tools())
    report = evaluate(
        engine, tokenizer, rows, cfg.eval, reward_type=cfg.reward.type, template=cfg.data.template,
        max_new_tokens=cfg.rollout.max_response_len, seed=cfg.run.seed, progress=not args.no_progress,
        batch_prompts=args.batch_prompts, stop=cfg.rollout.stop,
        verifier=make_verifier(cfg.reward.type, cfg.reward.timeout_s), **options,
    )
    report.meta.update(checkpoint=str(ckpt), data=args.data or "config eval split", config_files=resolved.files,
                       overrides=resolved.overrides)
    name = args.name or str(ckpt)
    table = {"baseline": baseline, name: report} if baseline is not None else {name: report}
    print(compare_table(table))
    print(f"reasons: {report.reasons}; truncated: {report.truncation_rate:.1%}")
    save_report(report, out)
    print(f"wrote {out}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"error: unexpected argument(s) {bad}; overrides look like key.path=value", file=sys.stderr)
        return 2
    extras = {name: getattr(args, _dest(name)) for name in registry.checkpoint_evaluations()
              if getattr(args, _dest(name)) is not None}
    if args.skip_eval and not extras:
        print("error: --skip-eval with no method evaluation to run (name one: "
              f"{', '.join('--' + n for n in registry.checkpoint_evaluations())})", file=sys.stderr)
        return 2
    try:
        ckpt, run_dir = find_checkpoint(args.path)
        resolved = resolve_config(args.config, run_dir, args.overrides)
        cfg = resolved.config
        rows = load_rows(cfg, args.data)
        baseline = None
        if args.baseline:
            try:
                baseline = load_report(args.baseline)
            except (OSError, ValueError, KeyError) as exc:
                raise EvalError(f"{args.baseline}: not a readable eval.json ({exc})") from None
    except (EvalError, ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import torch

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(cfg.rollout.threads)
    log.info("checkpoint: %s; %d held-out rows (evaluating %d)", ckpt, len(rows), min(len(rows), cfg.eval.n_prompts))
    tokenizer = load_tokenizer(ckpt)
    out = _out_path(args.out, ckpt)
    if not args.skip_eval:
        held_out_evaluation(args, ckpt, tokenizer, rows, resolved, baseline, out)
    if extras:
        from slime_ext.orchestration.local_endpoints import with_local_endpoints

        served = with_local_endpoints(cfg)  # a `solver:` cloud or judge the evaluation calls, served here
        for name, argument in extras.items():
            try:
                registry.load_object(registry.checkpoint_evaluations()[name])(
                    ckpt, argument, tokenizer, rows, served, out, EmbeddedEngine.from_pretrained)
            except ValueError as exc:
                print(f"error: --{name}: {exc}", file=sys.stderr)
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
