"""SxS study: standard CoT SFT -> RL vs SxS SFT -> RL (and, on v2, the answer-after-reasoning control), accuracy
and latency.

    python scripts/sxs_study.py [--task v2] [--seeds 0 1 2] [--cot-runs runs/duet_study_v2] [--runs DIR] [--out DIR]
                                [--report-only] [k=v ...]

Runs per seed (main-job runs, `run.seed=SEED`; finished runs are skipped and a run stopped part-way continues from its
checkpoint, so an interrupted study resumes; on v2 a run kept under `--out`/runs/ is read, not run again, so the study
goes on across machines once the warm starts and the CoT tokenizer it names are restored):
- `cot`: `configs/grpo.yaml` (SFT warm start on the plain `Step k:` ... `\\boxed{N}` solutions, then GRPO);
  its `eval_warm_start.json` is the "CoT SFT" row, its `eval_final.json` the "CoT SFT->RL" row;
- `sxs_sft`: `configs/sxs_sft.yaml` (SFT on the same task's solutions interleaved by Algorithm 1,
  `sxs.interleave_data`), `eval_sft.json` -> "SxS SFT";
- `sxs_rl`, `sxs_rl_shaping`: `configs/sxs_rl.yaml` with `sxs.qp_shaping=false` / `true`, RL from that same
  SxS warm start (same cache key as `sxs_sft`; the study checks the recorded warm-start paths agree),
  `eval_final.json` -> "SxS SFT->RL" / "SxS SFT->RL +shaping".

`--task v2` (the default): task family v2 (configs/tasks/v2.yaml after each config), the SFT seed following the run
seed (each seed its own warm starts), RL prompts from a recurring pool of 256, 1026 held-out prompts (114 per level).
The CoT run is the DUET study's full-GRPO run of the seed (the same config and keys; `--cot-runs` names that study's
runs folder to reuse it, and its kept runs under `--cot-kept` (results/duet_study_v2) are read where that folder has
none, else it runs here; a tokenizer a kept CoT run names is built again from its data where this machine has none).
The SxS data report the running total after half the intermediate steps (`sxs.disclosure_share=0.5`: think blocks span
one to several steps, so their number and size can move under RL and the shaping), and two more runs give the control
that separates interleaving from restating the answer: `restated_sft` / `restated_rl`
(`sxs.answer_placement=after_reasoning`: the same text with the whole account after the reasoning) -> "Restated SFT" /
"Restated SFT->RL". Every SxS-format run uses the CoT run's tokenizer (`tokenizer.path`), so lengths and latencies are
in the same tokens; their responses are longer (the account), so their `rollout.max_response_len` is 640 against CoT's
480 (V10 at share 0.5: up to ~620 tokens with that tokenizer). Latency in seconds: each arm's weights are served by
our HTTP server and 64 held-out prompts streamed one at a time (`slime_ext.tools.stream_timing`, the SxS formats'
speak stream) as soon as the arm's run finishes (so a study stopped later in the seed keeps it), kept under
`--out`/latency/seedS/ (a later session on another machine or boot in its own subfolder; the seconds tables pair
two arms only within one session, `slime_ext.tools.stream_sessions`) and summarised as first_visible_s,
first_disclosure_s and total_s (`slime_ext.methods.sxs.metrics.seconds_metrics`). The noise floor's sharpening baseline (results/noise_floor_v2) is a
row per format: "CoT SFT, T = 0.4 (sharpening)" is the DUET study's evaluation of the same warm start at T = 0.4 (read
from `--cot-runs` or its kept copy), "SxS SFT, T = 0.4 (sharpening)" the SxS warm start evaluated at T = 0.4 as soon as its
SFT run finishes (`eval_checkpoint`, which scores the visible answer as the run does), each paired with its format's
SFT->RL arm: what RL adds over sampling cooler. `--task v1` is the committed results/sxs_study (the default job's
level, one seed, SFT seed 0, each arm's own tokenizer).

Columns (`--out`/table.md, table.json; mean ± std over seeds): held-out mean@4 / pass@4 / greedy, the
truncation rate, and the latency metrics of `slime_ext.methods.sxs.metrics` averaged over the sampled eval
responses (`meta.response_metrics` of the eval json): ARI, ABO, AIRW, think blocks, total / reasoning /
response lengths, first substantive disclosure, all in tokens of the response without its EOS. For the
CoT rows the same metrics treat the `Step` reasoning as one think block and the final `\\boxed{}` line
as the only speak block (`cot_channels`). Then paired differences prompt by prompt (what RL adds, what the shaping
adds; on v2 interleaved against restated), and of the disclosure metrics themselves (think blocks, AIRW, first
disclosure: what RL and the shaping change, from the records' per-sample values; runs evaluated before they were kept
say so). Plot `block_count.png`: think blocks per rollout (`sxs/think_blocks`), the
think window before each speak block (`sxs/airw`) and training accuracy (`reward/correct`; GRPO: `reward/mean`) over
RL steps. `k=v` overrides apply to every run (so not `sxs.*`: the CoT arm is a grpo run, whose config has no `sxs`
section).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from slime_ext.studies import keep_run_files, read_metrics  # noqa: E402
from slime_ext.tools.study import (across_seeds_cell, append_section, command_line, config_on_task,  # noqa: E402
                                   difference_table, finished_run, restore_tokenizer, reuse, run_one, save_figure,
                                   sharpening_eval, summarise, tokenizer_of, write_table)
from slime_ext.tools.study import warm_start_of as checked_warm_start  # noqa: E402
from slime_ext.tools.stream_sessions import common_session, find_timeline, folder_for_new_stream  # noqa: E402

# run slug -> (config, extra overrides); arm -> (run slug, eval json of that run)
RUNS = {
    "cot": ("grpo.yaml", []),
    "sxs_sft": ("sxs_sft.yaml", []),
    "sxs_rl": ("sxs_rl.yaml", ["sxs.qp_shaping=false"]),
    "sxs_rl_shaping": ("sxs_rl.yaml", ["sxs.qp_shaping=true"]),
}
RESTATED = ["sxs.answer_placement=after_reasoning"]
CONTROL_RUNS = {
    "restated_sft": ("sxs_sft.yaml", RESTATED),
    "restated_rl": ("sxs_rl.yaml", [*RESTATED, "sxs.qp_shaping=false"]),
}
ARMS = {
    "CoT SFT": ("cot", "eval_warm_start.json"),
    "CoT SFT->RL": ("cot", "eval_final.json"),
    "SxS SFT": ("sxs_sft", "eval_sft.json"),
    "SxS SFT->RL": ("sxs_rl", "eval_final.json"),
    "SxS SFT->RL +shaping": ("sxs_rl_shaping", "eval_final.json"),
}
CONTROL_ARMS = {"Restated SFT": ("restated_sft", "eval_sft.json"), "Restated SFT->RL": ("restated_rl", "eval_final.json")}
RL_CURVES = {"CoT SFT->RL": "cot", "SxS SFT->RL": "sxs_rl", "SxS SFT->RL +shaping": "sxs_rl_shaping",
             "Restated SFT->RL": "restated_rl"}
# Runs that must share one warm start (the family's SFT weights): the run that trains it, then those that start from it
FAMILIES = {"SxS": ("sxs_sft", "sxs_rl", "sxs_rl_shaping"), "Restated": ("restated_sft", "restated_rl")}
V2_HELD_OUT = ["data.synthetic.n_eval=1026", "eval.n_prompts=1026"]
TASKS = {
    "v1": {"seeds": [0], "common": [], "suffix": "", "warm_start_per_seed": False, "control": False,
           "sxs_data": [], "same_tokenizer": False, "latency_prompts": 0, "sharpening": None},
    # the DUET study's full-GRPO keys (its COMMON and v2 held-out set), so its runs are this study's CoT runs
    "v2": {"seeds": [0, 1, 2], "common": ["rollout.prompt_pool=256", *V2_HELD_OUT], "suffix": "_v2",
           "warm_start_per_seed": True, "control": True,
           "sxs_data": ["sxs.disclosure_share=0.5", "rollout.max_response_len=640"], "same_tokenizer": True,
           # streamed one at a time from our server at T = 1 (slime_ext.tools.stream_timing): latency in seconds
           "latency_prompts": 64,
           # the noise floor's sharpening baseline (results/noise_floor_v2): each format's warm start sampled cooler
           "sharpening": 0.4},
}
# the sharpening rows, by format: (the run whose warm start is sampled, the folder its evaluation is kept in); CoT's is
# the DUET study's (same warm start, same held-out set), read from its runs or kept copy, evaluated here only where neither has it
SHARP = "{family} SFT, T = {t} (sharpening)"
SHARPENING = {"CoT": ("cot", "sharpening_T{t}-seed{seed}"), "SxS": ("sxs_sft", "sxs_sharpening_T{t}-seed{seed}")}
SHARP_EVAL = "eval_sharpening.json"
# what each task's paired difference tables compare: (reference arm, other arm)
DIFFERENCES = [("CoT SFT", "CoT SFT->RL"), ("SxS SFT", "SxS SFT->RL"), ("SxS SFT->RL", "SxS SFT->RL +shaping")]
CONTROL_DIFFERENCES = [("Restated SFT", "SxS SFT"), ("Restated SFT->RL", "SxS SFT->RL"), ("CoT SFT->RL", "SxS SFT->RL")]
# the disclosure mechanism paired prompt by prompt (the records' per-sample latency metrics, evaluations from 298aa86
# on): does RL, and does the shaping, change how many think blocks there are, how long each waits, when content shows
MECHANISM_DIFFERENCES = [("SxS SFT", "SxS SFT->RL"), ("SxS SFT->RL", "SxS SFT->RL +shaping")]
# and what interleaving changes in disclosure against the same content restated after the reasoning (v2's control)
CONTROL_MECHANISM_DIFFERENCES = [("Restated SFT", "SxS SFT")]
MECHANISM_METRICS = ("think_blocks", "airw", "first_disclosure")
# and in seconds of a streamed response: the mechanism pairs and the formats' own comparison


def seconds_pairs(control: bool) -> list[tuple[str, str]]:
    return MECHANISM_DIFFERENCES + (CONTROL_MECHANISM_DIFFERENCES if control else []) + \
        [("CoT SFT", "SxS SFT"), ("CoT SFT->RL", "SxS SFT->RL")]


# what RL adds over sampling the same warm start cooler, per format
SHARP_DIFFERENCES = [("CoT SFT, T = {t} (sharpening)", "CoT SFT->RL"), ("SxS SFT, T = {t} (sharpening)", "SxS SFT->RL")]
ACCURACY = {"mean@4": "mean@4", "pass@4": "pass@4", "greedy": "greedy", "truncated": "truncation_rate"}
LATENCY = {"ARI": "ari", "ABO": "abo", "AIRW": "airw", "think_blocks": "think_blocks", "total_len": "total_len",
           "reasoning_len": "reasoning_len", "response_len": "response_len", "first_disclosure": "first_disclosure"}
SECONDS = ("first_visible_s", "first_disclosure_s", "total_s")
KEYS = [*ACCURACY, *LATENCY]


def row_of(run: Path, eval_name: str) -> dict[str, float]:
    """Table row from one eval json of a run: accuracy keys and `meta.response_metrics` (NaN skipped)."""
    report = json.loads((run / eval_name).read_text())
    row = {k: float(report[src]) for k, src in ACCURACY.items() if report.get(src) is not None}
    latency = report.get("meta", {}).get("response_metrics", {})
    for k, src in LATENCY.items():
        value = latency.get(src)
        if value is not None and value == value:
            row[k] = float(value)
    return row


def warm_start_of(run: Path) -> Optional[str]:
    return json.loads((run / "summary.json").read_text()).get("stages", {}).get("sft", {}).get("warm_start")


def check_same_warm_start(runs: dict[str, Path], family: str = "SxS") -> str:
    """The runs of one family must share one warm start (its SFT weights); returns its path."""
    starts = {slug: warm_start_of(run) for slug, run in runs.items() if slug in FAMILIES[family]}
    if len(set(starts.values())) != 1 or None in starts.values():
        raise RuntimeError(f"the {family} runs do not share one SFT warm start: {starts}")
    return next(iter(starts.values()))


def checkpoint_of(run: Path, eval_name: str) -> str:
    """The weights an arm's row evaluates: the run's warm start for its SFT rows (checked against the build the run
    recorded), its final weights otherwise."""
    return checked_warm_start(run) if eval_name in ("eval_warm_start.json", "eval_sft.json") else str(run / "hf")


def timing_name(arm: str) -> str:
    """The file name of an arm's streamed timelines in a seed's session folder (slime_ext.tools.stream_sessions)."""
    return f"{arm.replace(' ', '_').replace('->', '_to_').replace('+', '')}.timing.jsonl"


def timing_path(folder: Path, arm: str) -> Path:
    """Where an arm's streamed timelines of one seed are kept (`folder` = a session folder of --out/latency/seedS)."""
    return folder / timing_name(arm)


def seconds_difference_table(out: Path, before: str, after: str, seeds: Sequence[int]) -> Optional[str]:
    """Latency in seconds of `after` minus `before`, paired by prompt id over the streamed prompts both arms timed in
    each seed, pooled over seeds; appended to `out/table.md`. None when no seed has both timelines. The study's table
    averages each arm over its own prompts; this pairs them, so prompt length drops out of the difference."""
    from slime_ext.algo.eval_stats import describe_difference, paired_difference
    from slime_ext.methods.sxs.metrics import seconds_metrics

    def per_prompt(folder: Path, arm: str) -> dict[str, dict[str, float]]:
        records = [json.loads(line) for line in timing_path(folder, arm).read_text().splitlines()]
        return {r.get("prompt_id", str(i)): seconds_metrics(r["deltas"], not arm.startswith("CoT"))
                for i, r in enumerate(records)}

    pairs: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in SECONDS}
    per_seed: dict[str, dict[int, float]] = {key: {} for key in SECONDS}  # each seed's mean paired difference
    used, apart = [], []
    for seed in seeds:
        seed_folder = out / "latency" / f"seed{seed}"
        folder = common_session(seed_folder, timing_name(before), timing_name(after))  # one machine and boot
        if folder is None:
            if find_timeline(seed_folder, timing_name(before)) and find_timeline(seed_folder, timing_name(after)):
                apart.append(seed)  # both streamed, but on different machines or days: seconds do not pair
            continue
        a, b = per_prompt(folder, before), per_prompt(folder, after)
        used.append(seed)
        for key in SECONDS:
            # the timed order, so the bootstrap is reproducible; left out where either arm disclosed nothing
            both = [(a[p][key], b[p][key]) for p in a if p in b and a[p][key] == a[p][key] and b[p][key] == b[p][key]]
            pairs[key][0].extend(x for x, _ in both)
            pairs[key][1].extend(y for _, y in both)
            if both:
                per_seed[key][seed] = sum(y - x for x, y in both) / len(both)
    if not used:
        return None
    note = f"; not paired, streamed in different sessions (machine or boot): seeds {apart}" if apart else ""
    lines = [f"## Latency in seconds: {after} minus {before} (streamed prompts, paired by prompt within seeds {used}, "
             f"each seed's pair streamed in one session{note})",
             "", "| metric | difference, s (paired over prompts, seeds pooled) | prompts | per seed; across seeds (t over "
             "seeds) |", "| --- | --- | --- | --- |"]
    for key, (a, b) in pairs.items():
        cell = describe_difference(paired_difference(a, b), 1.0, "s", 3) if a else "- (no prompt disclosed in both arms)"
        spread = across_seeds_cell(per_seed[key], 1.0, 3) if per_seed[key] else "-"
        lines.append(f"| {key} | {cell} | {len(a)} | {spread} |")
    return append_section(out, "\n".join(lines))


def seconds_row(run: Path, eval_name: str, arm: str, folder: Path, prompts: int, measure: bool = True) -> dict[str, float]:
    """Latency in seconds of `prompts` streamed responses of the arm's weights (SxS formats: the speak stream), measured
    once and kept in the seed's latency `folder` (a study resumed later, or `--report-only`, reads it; without it and
    `measure`, none); a later session on another machine streams into its own subfolder, so pairs stay side by side."""
    from slime_ext.methods.sxs.metrics import seconds_summary

    timing = find_timeline(folder, timing_name(arm))  # any session's; comparisons pair within one session
    if timing is None:
        if not measure:
            return {}
        timing = stream_arm(run, eval_name, arm, folder, prompts)
        if timing is None:
            return {}
    records = [json.loads(line) for line in timing.read_text().splitlines()]
    return {k: v for k, v in seconds_summary(records, not arm.startswith("CoT")).items() if k in SECONDS and v == v}


def stream_arm(run: Path, eval_name: str, arm: str, folder: Path, prompts: int) -> Optional[Path]:
    """Stream `prompts` responses of the arm's weights into this session's folder of the seed's latency `folder`;
    None (said on stdout) when the weights are not on this machine."""
    checkpoint = checkpoint_of(run, eval_name)  # reads the summary and checks the warm start's build once
    if not (REPO / checkpoint).exists():  # a run kept from another machine keeps no weights
        print(f"[study] {arm}: latency not measured, its weights {checkpoint} are not on this "
              "machine (measure it on the machine that ran it)", flush=True)
        return None
    timing = timing_path(folder_for_new_stream(folder), arm)
    subprocess.run([sys.executable, "-m", "slime_ext.tools.stream_timing", checkpoint, "--config",
                    str(run / "config.yaml"), "--prompts", str(prompts), "--out", str(timing),
                    *([] if arm.startswith("CoT") else ["--speak-only"])], cwd=REPO, check=True)
    return timing


def stream_partners(arm: str, folder: Path, finished: dict[str, tuple[Path, str]], pairs: Sequence[tuple[str, str]],
                    prompts: int) -> None:
    """After `arm` was streamed in a later session than the seed's first (another machine or boot): stream again, into
    this session's folder, each finished arm it is compared with in seconds, so every pair stays side by side."""
    session = folder_for_new_stream(folder)
    if session == folder:
        return  # the seed's first session: its arms are streamed there as their runs finish
    for partner in (b if a == arm else a for a, b in pairs if arm in (a, b)):
        if partner in finished and not timing_path(session, partner).exists():
            print(f"[study] {partner}: streamed again beside {arm} ({session.name})", flush=True)
            stream_arm(*finished[partner], partner, folder, prompts)


def sharpening_report(args: argparse.Namespace, family: str, run: Path, seed: int, t: float) -> Optional[Path]:
    """The family's warm start sampled at T = `t` on the held-out set (`eval_sharpening.json`): kept under --out/runs/,
    or for CoT the DUET study's (its --cot-runs folder or kept copy), else evaluated here and kept (None with
    --report-only, or when the warm start's weights are not on this machine)."""
    folder = SHARPENING[family][1].format(t=t, seed=seed)
    places = [args.out / "runs" / folder]
    if family == "CoT" and args.cot_runs is not None:
        places += [args.cot_runs / folder, args.cot_kept / "runs" / folder]
    found = next((p / SHARP_EVAL for p in places if (p / SHARP_EVAL).is_file()), None)
    if found is not None or args.report_only:
        return found
    warm = warm_start_of(run)
    if warm is None or not (REPO / warm).exists():
        print(f"[study] {family} sharpening seed {seed}: not evaluated, its warm start {warm} is not on this machine",
              flush=True)
        return None
    report = sharpening_eval(run, t, args.runs / folder)
    keep_run_files(report.parent, args.out / "runs" / folder, (SHARP_EVAL,))
    return report


def run_overrides(task: str, slug: str, tokenizer: Optional[str], overrides: list[str], extra: list[str]) -> list[str]:
    """The task's keys for one run: its held-out set and pool for every run; for the SxS-format runs the data
    settings and the CoT run's tokenizer; on v2 the RL runs do not evaluate the warm start again (their family's SFT
    run did). The run's own keys come last (they win)."""
    t = TASKS[task]
    out = list(t["common"])
    if slug != "cot":
        out += t["sxs_data"]
        if tokenizer is not None:
            out.append(f"tokenizer.path={tokenizer}")
        if t["warm_start_per_seed"] and not slug.endswith("_sft"):
            out.append("eval.warm_start=false")
    return out + overrides + extra


def curve(run: Path, *keys: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the first of `keys` each metrics.jsonl row has (NaN when none)."""
    m = read_metrics(run)
    values = [next((float(x[k]) for k in keys if k in x), float("nan")) for x in m]
    return [x["step"] for x in m], values


def plots(out: Path, curves: dict[str, dict[int, Path]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (blocks, window, acc) = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, (arm, runs) in enumerate(curves.items()):  # one colour per arm, one line style per seed
        for j, (seed, run) in enumerate(sorted(runs.items())):
            style = {"color": f"C{i}", "linestyle": ("-", "--", ":", "-.")[j % 4], "label": f"{arm}, seed {seed}"}
            if not arm.startswith("CoT"):
                blocks.plot(*curve(run, "sxs/think_blocks"), **style)
                window.plot(*curve(run, "sxs/airw"), **style)
            acc.plot(*curve(run, "reward/correct", "reward/mean"), **style)
    blocks.set_title("think blocks per rollout")
    window.set_title("think tokens before each speak block (AIRW)")
    acc.set_title("training accuracy (visible answer)")
    for ax in (blocks, window, acc):
        ax.set_xlabel("RL step")
        if ax.lines:  # the block panels stay empty until an SxS-format RL run has finished
            ax.legend(fontsize=8)
    return save_figure(fig, out / "block_count.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="v2")
    ap.add_argument("--seeds", type=int, nargs="+", help="default: v1 0, v2 0 1 2")
    ap.add_argument("--runs", type=Path, help="default: runs/sxs_study (v1), runs/sxs_study_v2 (v2)")
    ap.add_argument("--out", type=Path, help="default: results/sxs_study (v1), results/sxs_study_v2 (v2)")
    ap.add_argument("--cot-runs", type=Path,
                    help="v2: the DUET study's runs folder (its GRPO_full-seedS runs are the CoT runs)")
    ap.add_argument("--cot-kept", type=Path, default=REPO / "results" / "duet_study_v2",
                    help="v2, with --cot-runs: the DUET study's --out, whose kept runs are read when --cot-runs has "
                         "none (default results/duet_study_v2)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: tabulate the runs that finished (a partial study says which are missing)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    task = TASKS[args.task]
    args.seeds = args.seeds or task["seeds"]
    args.runs = args.runs or REPO / "runs" / f"sxs_study{task['suffix']}"
    args.out = args.out or REPO / "results" / f"sxs_study{task['suffix']}"
    command = command_line("sxs_study.py", argv)
    plan = {**RUNS, **(CONTROL_RUNS if task["control"] else {})}
    arms = {**ARMS, **(CONTROL_ARMS if task["control"] else {})}
    sharp_t = task["sharpening"]
    sharp_arms = {SHARP.format(family=f, t=sharp_t): f for f in SHARPENING} if sharp_t is not None else {}
    sharp_after = {SHARPENING[f][0]: (arm, f) for arm, f in sharp_arms.items()}  # the run whose warm start it samples
    # each sharpening row follows its format's SFT row
    order = [x for a in arms for x in (a, *(b for b, f in sharp_arms.items() if a == f"{f} SFT"))]
    rows: dict[str, list[dict[str, float]]] = {a: [] for a in order}
    runs: dict[str, dict[int, Path]] = {a: {} for a in arms}  # by seed: a difference pairs only the seeds both arms ran
    baselines: dict[str, dict[int, Path]] = {a: {} for a in sharp_arms}  # the sharpening rows' eval json by seed
    curves: dict[str, dict[int, Path]] = {a: {} for a, slug in RL_CURVES.items() if slug in plan}  # by seed
    missing, warm_starts = [], []
    for seed in args.seeds:
        done: dict[str, Path] = {}
        seconds: dict[str, dict[str, float]] = {}  # arm -> its latency in seconds this seed
        tokenizer = None
        for slug, (config, extra) in plan.items():
            parent = args.runs / f"{slug}-seed{seed}"
            if slug == "cot" and args.cot_runs is not None:
                parent = args.cot_runs / f"GRPO_full-seed{seed}"
            if task["same_tokenizer"] and slug != "cot":
                if "cot" not in done:  # the SxS-format runs need the CoT run's tokenizer
                    missing.append(f"{slug} seed {seed}")
                    continue
                tokenizer = tokenizer_of(done["cot"])
            # v2: a run kept under --out/runs/ (finished on another machine) is read, not run again; the CoT run
            # also from the DUET study's kept runs
            run = reuse(args.out, parent, args.report_only) if task["suffix"] else None
            if run is None and task["suffix"] and slug == "cot" and args.cot_runs is not None:
                run = reuse(args.cot_kept, parent, args.report_only)
            if args.report_only and not task["suffix"]:
                run = finished_run(parent)
            elif run is None and not args.report_only:
                if tokenizer is not None:  # built again from the CoT run's data where it finished elsewhere
                    restore_tokenizer(done["cot"], args.runs / f"cot_tokenizer-seed{seed}")
                overrides = run_overrides(args.task, slug, tokenizer, args.overrides, extra)
                run = run_one(config_on_task(config, args.task, parent), seed, parent, overrides,
                              shared_sft_seed=seed if task["warm_start_per_seed"] else 0)
                if task["suffix"]:  # v2: each finished run's small files and records land under --out as it finishes
                    keep_run_files(run, args.out / "runs" / parent.name)
            if run is None:
                missing.append(f"{slug} seed {seed}")
                continue
            done[slug] = run
            for arm in (a for a, (s, _) in arms.items() if s == slug and task["latency_prompts"]):
                # streamed as soon as the run is there, so a study stopped later in the seed keeps it
                latency = args.out / "latency" / f"seed{seed}"
                streamed_before = find_timeline(latency, timing_name(arm)) is not None
                seconds[arm] = seconds_row(run, arms[arm][1], arm, latency, task["latency_prompts"],
                                           measure=not args.report_only)
                if not (streamed_before or args.report_only) and find_timeline(latency, timing_name(arm)):
                    finished = {a: (done[s], e) for a, (s, e) in arms.items() if s in done}
                    stream_partners(arm, latency, finished, seconds_pairs(task["control"]), task["latency_prompts"])
            if slug in sharp_after:  # as soon as the family's warm start is there
                arm, family = sharp_after[slug]
                report = sharpening_report(args, family, run, seed, sharp_t)
                if report is None:
                    missing.append(f"{arm} seed {seed}")
                else:
                    baselines[arm][seed] = report
                    rows[arm].append(row_of(report.parent, report.name))
        for family, slugs in FAMILIES.items():
            if all(s in done for s in slugs):
                warm_starts.append(check_same_warm_start(done, family))
        for arm, (slug, eval_name) in arms.items():
            if slug in done:
                rows[arm].append({**row_of(done[slug], eval_name), **seconds.get(arm, {})})
                runs[arm][seed] = done[slug]
        for arm in curves:
            if RL_CURVES[arm] in done:
                curves[arm][seed] = done[RL_CURVES[arm]]
    summary = summarise({a: r for a, r in rows.items() if r})
    title = "SxS study: standard CoT vs SxS, SFT and SFT -> RL (latency in tokens" + \
        (f"; in seconds over {task['latency_prompts']} streamed responses per arm)" if task["latency_prompts"] else ")")
    if missing:
        title += f"; not run: {', '.join(missing)}"
    keys = KEYS + (list(SECONDS) if task["latency_prompts"] else [])
    paths = {a: [str(r) for r in rs.values()] for a, rs in {**runs, **baselines}.items() if rs}
    table = write_table(args.out, title, summary, paths, args.seeds, command, keys)
    evals = {arm: {seed: run / arms[arm][1] for seed, run in rs.items()} for arm, rs in runs.items()}
    evals.update(baselines)
    pairs = DIFFERENCES + (CONTROL_DIFFERENCES if task["control"] else [])
    pairs += [(b.format(t=sharp_t), a) for b, a in SHARP_DIFFERENCES] if sharp_t is not None else []
    for before, after in pairs:
        if evals.get(before) and evals.get(after):  # paired within the seeds both arms ran
            print(difference_table(args.out, {arm: evals[arm] for arm in (before, after)}, before))
    mechanism_pairs = MECHANISM_DIFFERENCES + (CONTROL_MECHANISM_DIFFERENCES if task["control"] else [])
    for (before, after), metric in ((p, m) for p in mechanism_pairs for m in MECHANISM_METRICS):
        if evals.get(before) and evals.get(after):
            print(difference_table(args.out, {arm: evals[arm] for arm in (before, after)}, before, metric=metric))
    if task["latency_prompts"]:  # and the formats' own comparison, in seconds where both warm starts were streamed
        for before, after in seconds_pairs(task["control"]):
            section = seconds_difference_table(args.out, before, after, args.seeds)
            if section:
                print(section)
    if warm_starts:
        (args.out / "sxs_warm_starts.json").write_text(json.dumps(warm_starts, indent=2) + "\n")
    print(table)
    if any(curves.values()):
        print(f"[study] plot {plots(args.out, {a: c for a, c in curves.items() if c})}")
    print(f"[study] wrote {args.out / 'table.md'} and {args.out / 'table.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
