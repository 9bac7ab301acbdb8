"""The benchmark's report: server_path.json (every number) and server_path.md (the tables)."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (lscpu), for the report's machine line."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def write_report(out: Path, data: dict[str, Any]) -> None:
    """`out`/server_path.json (all of `data`) and `out`/server_path.md (its tables)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "server_path.json").write_text(json.dumps(data, indent=2) + "\n")
    m, w, tp, r = data["meta"], data["workload"], data["throughput"], data["ratios"]
    lines = ["# server path benchmark (engine servers vs the in-process engine)", "",
             f"- command: `{m['command']}`",
             f"- date: {m['date']}; machine: {m['cpu']}, {m['cpu_count']} cores ({m['host']}); torch {m['torch']}; "
             f"one torch thread in the engine and in each server; load average (1 min) {m['load_before']:.1f} at the "
             f"start, {m['load_after']:.1f} at the end",
             f"- workload: {w['prompts']} prompts x {w['n']} samples = {w['requests']} requests, mean prompt "
             f"{w['prompt_len_mean']:.0f} tokens, max_response_len {w['max_len']} (ragged caps, mean "
             f"{w['length_cap_mean']:.0f}, or EOS), temperature {w['temperature']}, model {w['model']}, "
             f"vocab {w['vocab']}; {m['repeats']} interleaved repeats, best kept, prefix caches flushed before each; "
             f"client max_concurrency {m['client_max_concurrency']} (server_1_concN: N)",
             "", "## Throughput", "",
             "| path | s (best) | generated tokens | tokens/s | / in-process | same tokens as in-process |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, v in tp.items():
        ratio = "1.00" if name == "in_process" else f"{r[name]:.2f}"
        same = "-" if name == "in_process" else f"{data['same_tokens'][name]:.0%}"
        lines.append(f"| {name} | {v['seconds']:.2f} | {v['generated_tokens']} | {v['tokens_per_s']:.0f} | "
                     f"{ratio} | {same} |")
    rate = {k: [t / x for t, x in zip(v["all_tokens"], v["all_seconds"])] for k, v in tp.items()}
    lines += ["", "Per repeat, against the same repeat's in-process run: " + "; ".join(
        f"{k} " + ", ".join(f"{a / b:.2f}" for a, b in zip(rate[k], rate["in_process"])) for k in tp if k != "in_process")
        + ".", "", f"Target (b)/(a) >= 0.85: {'met' if data['targets']['server_1_within_15pct'] else 'NOT met'} "
                   f"({r['server_1']:.2f}, best against best)."]
    pr = data.get("profile")
    if pr:
        calls = pr["calls"]
        lines += ["", "### Where the server path's time goes (one traced run, 1 server)", "",
                  f"The same workload through a server whose batcher logs each `engine.generate` call: "
                  f"{pr['seconds']:.2f} s, {pr['tokens_per_s']:.0f} tokens/s. Offsets from the client's "
                  f"`generate` call:", "",
                  f"- the client sent its {w['requests']} HTTP requests at "
                  f"+{pr['client_sends_s'][0]:.2f} .. +{pr['client_sends_s'][1]:.2f} s; the server's batcher got "
                  f"them at +{pr['server_arrivals_s'][0]:.2f} .. +{pr['server_arrivals_s'][1]:.2f} s (longest "
                  f"pause between two arrivals {pr['arrival_gap_max_s'] * 1e3:.0f} ms);",
                  f"- {len(calls)} generate call(s): " + "; ".join(
                      f"{c['size']} requests at +{c['start_s']:.2f} s for {c['seconds']:.2f} s" for c in calls[:8])
                  + (f"; ... ({len(calls) - 8} more)" if len(calls) > 8 else "") + ";",
                  f"- after the last call: {pr['tail_s']:.2f} s until the client had every response "
                  f"(responses serialised, sent and parsed).",
                  f"- in-process, one call of all {w['requests']} took {tp['in_process']['seconds']:.2f} s "
                  f"(best run above)."]
    load = data.get("load")
    if load:
        lines += ["", "## Latency under load", "",
                  f"{next(iter(load.values()))['requests']} requests sent at once through one client to one server "
                  f"(client max_concurrency {next(iter(load.values()))['client_max_concurrency']}, one request per "
                  f"call: the server's latency per request); completion time of each request from the start, client "
                  f"side:", "",
                  "| server | s (all) | generated tokens | p10 s | median s | p90 s | max s | median / max |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, v in load.items():
            lines.append(f"| {name} | {v['seconds']:.2f} | {v['generated_tokens']} | {v['p10_s']:.2f} | "
                         f"{v['p50_s']:.2f} | {v['p90_s']:.2f} | {v['max_s']:.2f} | {v['median_over_max']:.2f} |")
    if data.get("notes"):
        lines += [""] + [f"- {n}" for n in data["notes"]]
    st, ms = data["step"], data.get("step_measured")
    export = ms["time_sync_export_s"] if ms else None
    lines += ["", "## Weight sync (1 server) and its share of an RL step", "",
              f"Step: {st['source']}: time/step {st['time_step_s']:.2f} s (rollout {st['time_rollout_s']:.2f} s, "
              f"train {st['time_train_s']:.2f} s, embedded sync {st['time_sync_s'] * 1e3:.0f} ms). A server path's "
              f"sync in the loop is export + push + commit; the export (trainer side, the same for every engine) is "
              + (f"{export * 1e3:.0f} ms, the measured run's time/sync_export." if export is not None else
                 "bounded by the embedded run's whole time/sync (export + the Ray copy): those metrics predate "
                 "time/sync_export."), "",
              "| method | commit ms | push ms (median) | sync in the loop ms | share of the step |",
              "| --- | ---: | ---: | ---: | ---: |"]
    sh = data["shares"]
    lines.append(f"| embedded (export + in-process copy via Ray) | - | - | {sh['embedded']['sync_s'] * 1e3:.0f} | "
                 f"{sh['embedded']['share']:.1%} |")
    for kind, v in data["sync"].items():
        lines.append(f"| {kind} | {v['commit_s'] * 1e3:.1f} | {v['push_s'] * 1e3:.1f} | "
                     f"{sh[kind]['sync_s'] * 1e3:.0f} | {sh[kind]['share']:.1%} |")
    lines += ["", "Target sync < 5% of the step: " + ", ".join(
        f"{k} {'met' if v else 'NOT met'}" for k, v in data["targets"]["sync_under_5pct"].items()) + "."]
    if ms:
        lines += ["", f"Measured here as well, {ms['source']}: time/step {ms['time_step_s']:.2f} s (rollout "
                      f"{ms['time_rollout_s']:.2f} s, train {ms['time_train_s']:.2f} s, mean response "
                      f"{ms['response_len_mean']:.0f} tokens), embedded time/sync {ms['time_sync_s'] * 1e3:.0f} ms "
                      + (f"(export {ms['time_sync_export_s'] * 1e3:.0f} ms)" if ms.get("time_sync_export_s") is not None else
                     "(the export happens inside the ranks' push since the sync from the ranks)")
                  + ". Shares of that step: "
                  + ", ".join(f"{k} {v['share']:.1%}" for k, v in data["shares_measured"].items()) + "."]
    elif data.get("step_measured_error"):
        lines += ["", f"The measured step run failed: {data['step_measured_error']}"]
    (out / "server_path.md").write_text("\n".join(lines) + "\n")
