"""Shared plumbing of the study scripts (`scripts/*_study.py`): resumable runs, mean/spread tables.

A study is a grid of main-job runs (config x seed), each in its own output folder; a run that already
finished (its `summary.json` says complete) is not run again, and a run stopped part-way continues from its last
checkpoint (`resume=`), so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]


def finished_run(parent: Path) -> Optional[Path]:
    for run in sorted(parent.glob("*/summary.json"), reverse=True):
        if json.loads(run.read_text()).get("complete"):
            return run.parent
    return None


def reuse(out: Path, parent: Path, report_only: bool) -> Optional[Path]:
    """A finished run without running anything: its copy kept under `out/runs/<parent's name>` when `parent` (the
    study's `--runs` folder for it) holds no finished run, i.e. it finished on another machine (every session may
    start on a fresh one, with only `results/`); with `report_only` also the finished run under `parent`. None: the
    study runs it (`run_one` skips or resumes what `parent` holds)."""
    from slime_ext.studies import kept_copy

    kept = kept_copy(out, parent.name)
    local = finished_run(parent)
    if kept is not None and local is None:
        if not report_only:
            print(f"[study] {parent.name}: kept earlier in {kept}, not run again (delete it to rerun)", flush=True)
        return kept
    return local if report_only else None


def require_on_machine(path: str | Path, what: str) -> None:
    """A kept run names its checkpoints and tokenizer by cache paths; on another machine they must be restored before
    anything trains from or evaluates them: stop with the command that restores a warm start."""
    if not (REPO / path).exists():
        raise SystemExit(f"{what}: {path} is not in this machine's cache; restore it first (python -m "
                         "slime_ext.tools.warm_start_archive unpack results/*/warm_starts/<label>-<key>.tar.gz "
                         ".cache/slime_ext), or delete the kept run under --out/runs/ to build it again")


def driver_env() -> dict[str, str]:
    """The environment of a main-job subprocess: Ray's token auth off unless the caller set it (a local cluster)."""
    return {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}


def tokenizer_of(run: Path) -> str:
    """The tokenizer a finished run used (its summary's tokenizer stage), as an absolute path."""
    return str(REPO / json.loads((run / "summary.json").read_text())["stages"]["tokenizer"]["path"])


def restore_tokenizer(run: Path, folder: Path) -> str:
    """The tokenizer a finished run used (its summary's tokenizer stage), built again from the run's own config where
    this machine lacks it. An embedded tokenizer is trained from the run's data and cached under a hash of its
    texts and vocabulary size, so the same config gives the same path and, as checked across machines, the same
    files: a study can go on from a run kept in `results/` without archiving its tokenizer."""
    recorded = tokenizer_of(run)
    if Path(recorded).exists():
        return recorded
    cmd = [sys.executable, "-m", "slime_ext.orchestration.driver", str(run / "config.yaml"),
           "run.stages=[data,tokenizer]", f"run.output_dir={folder}"]
    print(f"[study] {recorded} is not on this machine; building it again: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env=driver_env())
    if not Path(recorded).exists():
        built = [json.loads(summary.read_text())["stages"]["tokenizer"]["path"]
                 for summary in sorted(folder.glob("*/summary.json"))]
        raise RuntimeError(f"{run}: its config built the tokenizer {built[-1] if built else '(none)'}, not the "
                           f"{recorded} its summary records (other data or tokenizer settings)")
    return recorded


# A study's task: None runs each config on its own task (v1's levels); otherwise an overlay put after the config.
TASK_OVERLAYS: dict[str, Optional[str]] = {"v1": None, "v2": "tasks/v2.yaml"}


def config_on_task(config: str, task: str, folder: Path) -> Path:
    """`configs/<config>` with the task's overlay after it: a file in `folder` that extends both (the overlay wins
    where both set a key), or the config itself where the task is the configs' own (v1)."""
    if task not in TASK_OVERLAYS:
        raise ValueError(f"unknown task {task!r}: one of {sorted(TASK_OVERLAYS)}")
    base = REPO / "configs" / config
    overlay = TASK_OVERLAYS[task]
    if overlay is None:
        return base
    folder = Path(folder).resolve()  # the driver runs in the repository root: a relative path would name configs/...
    folder.mkdir(parents=True, exist_ok=True)
    composed = folder / f"{Path(config).stem}.{task}.yaml"
    composed.write_text(f"# {config} on task {task} (written by slime_ext.tools.study)\n"
                        f"extends: [{base}, {REPO / 'configs' / overlay}]\n")
    return composed


def interrupted_run(parent: Path) -> Optional[Path]:
    """The newest run under `parent` that stopped before completing but kept a checkpoint (a study killed at the
    end of a session): resuming it loses only the steps after that checkpoint."""
    for summary in sorted(parent.glob("*/summary.json"), reverse=True):
        run = summary.parent
        if not json.loads(summary.read_text()).get("complete") and (run / "checkpoints" / "latest").exists():
            return run
    return None


def run_one(config: str | Path, seed: int, parent: Path, overrides: Sequence[str], shared_sft_seed: int = 0) -> Path:
    """One main-job run (resumed study: skipped when already complete, continued from its checkpoint when stopped
    part-way); returns its run directory. `config`: a name under configs/ or a path (`config_on_task`); `parent`
    may be relative to the caller's directory (the driver runs in the repository root)."""
    parent = Path(parent).resolve()
    done = finished_run(parent)
    if done is not None:
        print(f"[study] {config} seed {seed}: done earlier ({done})", flush=True)
        return done
    stopped = interrupted_run(parent)
    if stopped is not None:  # its config.yaml holds the overrides it started with
        cmd = [sys.executable, "-m", "slime_ext.orchestration.driver", f"resume={stopped}"]
    else:
        cmd = [sys.executable, "-m", "slime_ext.orchestration.driver", str(REPO / "configs" / config),
               f"run.seed={seed}", f"sft.seed={shared_sft_seed}", f"run.output_dir={parent}", *overrides]
    print(f"[study] {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env=driver_env())
    run = finished_run(parent)
    if run is None:
        raise RuntimeError(f"{config} seed {seed}: the run ended without a complete summary under {parent}")
    return run


def warm_start_of(run: Path) -> str:
    """The SFT warm start a run trained from (its summary's sft stage), checked against the build id the run recorded
    where both are known: the cache may hold other weights under the same key (`warm_start_marker`)."""
    from slime_ext.orchestration.warm_start_marker import check_build

    sft = json.loads((run / "summary.json").read_text())["stages"]["sft"]
    check_build(REPO / sft["warm_start"], sft.get("build"), f"the warm start of {run}")
    return sft["warm_start"]


def sharpening_eval(run: Path, temperature: float, folder: Path) -> Path:
    """The warm start of `run` evaluated at `temperature` on the run's held-out set (its config's eval keys), once
    per seed: `folder/eval_sharpening.json` with its per-prompt records, so the table pairs it with every arm prompt by prompt.
    What a cooler sampler gives without training is the gain an RL arm has to beat (results/noise_floor_v2)."""
    report = folder / "eval_sharpening.json"
    if report.exists():
        return report
    return eval_checkpoint(warm_start_of(run), run / "config.yaml", report, f"eval.temperature={temperature}",
                           "eval.greedy=false")


def eval_checkpoint(checkpoint: str | Path, config: Path, report: Path, *args: str, then: Sequence[str] = ()) -> Path:
    """`python -m slime_ext.tools.eval_checkpoint CHECKPOINT --config CONFIG [ARGS] --out REPORT [THEN]` (the command
    is printed), as the studies evaluate what trains nothing; returns `report`."""
    cmd = [sys.executable, "-m", "slime_ext.tools.eval_checkpoint", str(checkpoint), "--config", str(config), *args,
           "--out", str(report), *then]
    print(f"[study] {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)
    return report


def save_figure(fig, path: Path) -> Path:
    """A study figure as a 120-dpi PNG, laid out tight, then closed: pyplot keeps every figure it made until it is
    closed, and a study draws several."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def append_section(out: Path, section: str) -> str:
    """Append a markdown section to `out/table.md` (the study's table comes first); returns the section."""
    table_md = out / "table.md"
    table_md.write_text((table_md.read_text() if table_md.exists() else "") + "\n" + section + "\n")
    return section


def evaluation_row(report: Path) -> dict[str, float]:
    """A baseline's row: the held-out scores only (it trains nothing, so it has no cost columns)."""
    final = json.loads(report.read_text())
    return {k: final[k] for k in ("mean@4", "pass@4", "greedy") if final.get(k) is not None}


def command_line(script: str, argv: Optional[Sequence[str]]) -> str:
    """The study's command as typed, quoted (an arm name with spaces stays one argument), for its table."""
    return f"python scripts/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)


def summarise(rows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per method and key: (mean, std over seeds, number of seeds), over the seeds where the value is finite (a
    time-to-target an arm never reached is NaN); NaN with 0 seeds where none is."""
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for method, runs in rows.items():
        out[method] = {}
        for k in sorted({k for r in runs for k in r}):
            vals = [r[k] for r in runs if k in r and math.isfinite(r[k])]
            if not vals:
                out[method][k] = (math.nan, math.nan, 0)
                continue
            out[method][k] = (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals))
    return out


def _number(x: float) -> str:
    """Three decimals, or three significant digits below 0.01 (a drift KL of 0.0040 against a floor of 0.0003
    would both print as 0.00x)."""
    return f"{x:#.3g}" if x != 0 and abs(x) < 0.01 else f"{x:.3f}"


def _cell(mean: float, std: float, n: int, all_seeds: int) -> str:
    """mean ± std where two or more seeds stand behind it (one seed has no spread: "± 0.000" would read as a
    measured zero); n named where it is not every seed."""
    text = f"{_number(mean)} ± {_number(std)}" if n > 1 else _number(mean)
    return text + (f" (n={n})" if n != all_seeds else "")


def write_table(out: Path, title: str, summary: dict, runs: dict[str, list[str]], seeds: Sequence[int],
                command: str, keys: Optional[list[str]] = None) -> str:
    """`table.json` and `table.md` (mean ± std over seeds) under `out`; returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"summary": summary, "runs": runs, "seeds": list(seeds)}, indent=2) + "\n")
    keys = keys or sorted({k for stats in summary.values() for k in stats})
    lines = ["| method | " + " | ".join(keys) + " |", "| --- | " + " | ".join("---" for _ in keys) + " |"]
    for method, stats in summary.items():
        cells = [_cell(*stats[k], all_seeds=len(seeds)) if k in stats else "-" for k in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    spread = "mean ± std over seeds" if len(seeds) > 1 else "one seed: no spread over seeds to show"
    meta = (f"command: `{command}`  \nseeds: {list(seeds)} ({spread})  \n"
            f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}, machine: {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs")
    table = "\n".join(lines)
    (out / "table.md").write_text(f"# {title}\n\n{meta}\n\n{table}\n")
    return table



def shared_seeds(reference: Mapping[int, object], arm: Mapping[int, object]) -> tuple[list[int], str]:
    """The seeds two arms can be paired on, and a note naming the seeds left out (an arm still running a seed,
    one that failed): pairing by position would match one seed's prompts with another seed's."""
    both = sorted(set(reference) & set(arm))
    left = sorted(set(reference) ^ set(arm))
    paired = f"seed{'s' if len(both) > 1 else ''} {', '.join(map(str, both))}"
    return both, (f" ({paired}; not paired: {', '.join(map(str, left))})" if left else "")


def across_seeds_cell(per_seed: Mapping[int, float], scale: float = 100.0, digits: int = 1) -> str:
    """Each seed's own difference (points; `scale=1` and `digits=2` for a metric in its own unit) and a t interval
    over them (seeds - 1 degrees of freedom): the pooled paired interval measures prompt noise only, this one the
    spread between seeds (different warm starts and runs), which is what a claim about the method has to beat. One
    seed has no such interval."""
    from slime_ext.studies.stats import ci_text, t_interval

    seeds = sorted(per_seed)
    each = ", ".join(f"s{seed} {scale * per_seed[seed]:+.{digits}f}" for seed in seeds)
    if len(seeds) < 2:
        return f"{each}; one seed, no interval across seeds"
    return f"{each}; {ci_text(t_interval([per_seed[seed] for seed in seeds]), scale, digits=digits)}"


def difference_table(out: Path, arm_evals: dict[str, Mapping[int, Path]], reference: str,
                     k: Optional[int] = None, metric: Optional[str] = None) -> str:
    """Each arm's held-out score minus the reference arm's, paired prompt by prompt within each seed (the
    per-prompt records beside each eval JSON; `arm_evals[arm]` maps a seed to its eval JSON), pooled over the
    seeds both arms have: mean ± SE and a 95% paired bootstrap interval, "no measured difference" when it holds
    0; beside it each seed's difference and a t interval across seeds (`across_seeds_cell`). Appended to
    `out/table.md`; returns the markdown section. `k`: mean of the first k samples per prompt (None: all
    samples). `metric`: a method metric of the records (`EvalReport.prompt_metric`, in its own unit) in place of the
    score; prompts where either arm leaves it undefined are left out of the pairs."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference
    from slime_ext.evaluation import load_report

    loaded: dict[Path, Optional[tuple[list[str], list]]] = {}  # the reference's evals serve every arm

    def scores(path: Path) -> Optional[tuple[list[str], list]]:
        if path not in loaded:
            report = load_report(path)
            values = report.prompt_metric(metric) if metric else report.prompt_scores(k)
            loaded[path] = (report.prompt_ids(), values) if report.records and values is not None else None
        return loaded[path]

    what = f"mean of {metric} over samples" if metric else "mean over samples" if k is None else f"mean@{k}"
    scale, unit, digits = (1.0, metric, 2) if metric else (100.0, "points", 1)
    lines = [f"## Difference to {reference} (held-out, per-prompt {what}, paired within seeds)", "",
             f"| arm | difference, {unit} (paired over prompts, seeds pooled) | per seed; across seeds (t over seeds) |",
             "| --- | --- | --- |"]
    for arm, paths in arm_evals.items():
        if arm == reference:
            continue
        seeds, note = shared_seeds(arm_evals[reference], paths)
        a: list[float] = []
        b: list[float] = []
        per_seed: dict[int, float] = {}
        for seed in seeds:
            ref_path, path = Path(arm_evals[reference][seed]), Path(paths[seed])
            ref, this = scores(ref_path), scores(path)
            if ref is None or this is None:  # evaluated before per-prompt records were written
                a = []
                break
            if ref[0] != this[0]:
                raise ValueError(f"{arm}: {path} and {ref_path} evaluated different prompts; cannot pair them")
            pairs = [(x, y) for x, y in zip(ref[1], this[1]) if x is not None and y is not None]
            if not pairs:  # the metric is undefined on every prompt of one arm (e.g. no speak block at all)
                continue
            a += [x for x, _ in pairs]
            b += [y for _, y in pairs]
            per_seed[seed] = statistics.fmean(y for _, y in pairs) - statistics.fmean(x for x, _ in pairs)
        if not seeds:
            cells = f"- (no seed in common with {reference}) | -"
        elif a:
            cells = (f"{describe_difference(paired_difference(a, b), scale, unit, digits)}{note} | "
                     f"{across_seeds_cell(per_seed, scale, digits)}")
        else:
            cells = (f"- (no per-prompt {metric} in these runs' records) | -" if metric
                     else "- (no per-prompt records in these runs) | -")
        lines.append(f"| {arm} | {cells} |")
    return append_section(out, "\n".join(lines))
