"""DA-GRPO's continual evaluation: after each phase, every phase's held-out set (greedy local answers, the
cloud for prompts that ask; with `dagrpo.eval_sampled` also one sampled answer per prompt), and the continual table
(during-task / post-switch accuracy, forgetting)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from slime_ext.methods.dagrpo.cloud import CloudTally, warn_if_cloud_degraded

log = logging.getLogger(__name__)


def evaluate_phases(method: Any, engine: Any, ended: int, run_dir: Path) -> dict:
    """Evaluate every phase's held-out rows after phase `ended`; write them and the continual table so far."""
    cfg = method.config
    out = {}
    records: list[dict] = []
    for k, phase in enumerate(cfg.dagrpo.phases):
        rows = method.phase_rows(k)[1][: cfg.eval.n_prompts]
        phase_records: list[dict] = []
        out[phase.name] = method.evaluate_rows(engine, rows, cfg.data.template, seed=cfg.run.seed,
                                               records=phase_records)
        records += [{"phase": phase.name, "decoding": "greedy", **r} for r in phase_records]
        if cfg.dagrpo.eval_sampled:  # one sampled answer per prompt: the rate the sampled policy shows
            sampled_records: list[dict] = []
            sampled = method.evaluate_rows(engine, rows, cfg.data.template, seed=cfg.run.seed, baselines=False,
                                           records=sampled_records, temperature=cfg.eval.temperature)
            out[phase.name].update({f"sampled/{k}": v for k, v in sampled.items()})
            records += [{"phase": phase.name, "decoding": "sampled", **r} for r in sampled_records]
        log.info("after phase %d, held-out %s: %s", ended, phase.name, out[phase.name])
        r = out[phase.name]  # unanswered cloud calls lower joint and cloud-alone accuracy: say so
        tally = CloudTally(int(r.get("cloud_calls", 0)), int(r.get("cloud_failures", 0)), int(r.get("cloud_skipped", 0)))
        warn_if_cloud_degraded(tally, cfg.dagrpo.cloud_failure_warn_rate,
                               f"evaluation of {phase.name} after phase {ended}")
    (run_dir / f"eval_after_phase_{ended}.json").write_text(json.dumps(out, indent=2) + "\n")
    # per-prompt records beside the aggregates, so phases and runs can be compared prompt by prompt
    (run_dir / f"eval_after_phase_{ended}.records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_continual_table(run_dir, [p.name for p in cfg.dagrpo.phases])
    return out


def write_continual_table(run_dir: Path, phases: list[str]) -> Optional[Path]:
    """during-task accuracy (phase k's set right after phase k), post-switch accuracy (after phase k+1),
    forgetting (during - post) / during, local-only and joint accuracy and cloud rate after the last phase."""
    evals = {k: json.loads((run_dir / f"eval_after_phase_{k}.json").read_text())
             for k in range(len(phases)) if (run_dir / f"eval_after_phase_{k}.json").exists()}
    if not evals:
        return None
    last = evals[max(evals)]
    lines = ["| phase | during-task acc | post-switch acc | forgetting | local-only acc (last) | joint acc (last) "
             "| cloud rate (last) | random router (last) | router classifier (last) | sampled: joint acc / cloud rate (last) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, name in enumerate(phases):
        during = evals.get(k, {}).get(name, {}).get("joint_accuracy")
        post = evals.get(k + 1, {}).get(name, {}).get("joint_accuracy")
        forget = (during - post) / during if during and post is not None else None
        cell = lambda v: "-" if v is None or v != v else f"{v:.3f}"  # noqa: E731
        row = last.get(name, {})
        lines.append(f"| {name} | {cell(during)} | {cell(post)} | {cell(forget)} | {cell(row.get('local_only_accuracy'))} "
                     f"| {cell(row.get('joint_accuracy'))} | {cell(row.get('cloud_rate'))} "
                     f"| {cell(row.get('random_router_joint_accuracy'))} | {cell(row.get('router_clf_joint_accuracy'))} "
                     f"| {cell(row.get('sampled/joint_accuracy'))} / {cell(row.get('sampled/cloud_rate'))} |")
    unanswered = sum(int(r.get("cloud_failures", 0)) + int(r.get("cloud_skipped", 0)) for r in last.values())
    if unanswered:
        calls = sum(int(r.get("cloud_calls", 0)) for r in last.values())
        lines.append(f"\n{unanswered} of {calls} cloud calls of the last evaluation got no answer (failed, or skipped "
                     "by the circuit breaker): its joint and cloud-alone accuracies are lower bounds.")
    path = run_dir / "continual_table.md"
    path.write_text("\n".join(lines) + "\n")
    return path
