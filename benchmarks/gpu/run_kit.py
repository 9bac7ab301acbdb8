"""The GPU kit: one command for a lent H100 / H200 machine, every section timed and failing on its own.

1. train: the Megatron train step in bf16 on a Qwen3-MoE-shaped model sized for one 80 GB GPU
   (benchmarks/train_step.py's gpu-moe preset; Transformer Engine spec when TE imports, else the local spec
   with torch SDPA attention) against plain HF training: tokens/s, MFU against the GPU's bf16 peak.
2. decode: the embedded engine on CUDA against HF `generate()` (benchmarks/decode.py's workloads) on a
   larger Qwen3-MoE (hidden 1024) so the GPU has work.
3. grpo_quick: the GRPO quick job through Ray, when `import ray` works there (Ray's wheel is larger than
   what one call can carry, so on the lent machines this section records why it was skipped).
`--dry` runs every section on the CPU at toy sizes (CI runs it), writing the same files.

    python3 benchmarks/gpu/run_kit.py --out $OUT            # on the GPU machine
    python benchmarks/gpu/run_kit.py --dry --out /tmp/kit     # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GPU_DECODE_MODEL = dict(hidden_size=1024, num_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                        intermediate_size=2048, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512)


TRAINERS = {"megatron_glue": "time_megatron", "hf_transformers": "time_hf"}
CHILD_RESULT = "KIT_CHILD_RESULT "  # the line a trainer child prints its timing on
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _train_preset(toy: bool, device: str) -> dict:
    from benchmarks import train_step as ts

    preset = dict(ts.PRESETS["cpu-tiny"], batch=8, steps=1, warmup=0) if toy else dict(ts.PRESETS["gpu-moe"])
    if toy and device == "cuda":
        preset["dtype"] = "bf16"
    return preset


def time_trainer(trainer: str, toy: bool, device: str) -> dict:
    """One trainer's timing on the preset's model (seed 0: both trainers start from the same weights)."""
    from benchmarks import train_step as ts
    from transformers import AutoModelForCausalLM

    preset = _train_preset(toy, device)
    dtype = torch.bfloat16 if preset["dtype"] == "bf16" else torch.float32
    torch.manual_seed(0)
    hf_config = ts.hf_config_for(preset)
    with torch.device(device):  # initialised on the GPU (a 2.7B model's CPU init takes minutes), kept on the CPU
        hf_state = {k: v.to("cpu", dtype) for k, v in AutoModelForCausalLM.from_config(hf_config).state_dict().items()}
    if device == "cuda":
        torch.cuda.empty_cache()
    samples = ts.make_samples(preset)
    timing = getattr(ts, TRAINERS[trainer])
    return _measured(lambda: timing(preset, hf_config, hf_state, samples, device), device)


def _trainer_in_child(trainer: str, toy: bool, timeout: float) -> dict:
    """Run `time_trainer` in a fresh process: the first trainer's GPU memory is not all returned to the
    allocator in-process (Megatron's globals hold on to it), and two 2.7B trainers do not fit one GPU."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--train-child", trainer, "--out", "/tmp"]
    size = ["--dry"] if not torch.cuda.is_available() else ["--toy"] if toy else []
    # a world of its own: a rendezvous address inherited from a parent that runs torch.distributed is taken
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # [tokens, vocab] fp32 tensors fragment memory
    done = subprocess.run(cmd + size, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(CHILD_RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{trainer} failed (exit {done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    return json.loads(lines[-1][len(CHILD_RESULT):])


def section_train(toy: bool, device: str, separate_processes: bool = False, child_timeout: float = 240) -> dict:
    from benchmarks import train_step as ts

    preset = _train_preset(toy, device)
    out: dict[str, Any] = {"preset": "cpu-tiny (toy)" if toy else "gpu-moe", "dtype": preset["dtype"],
                           "separate_processes": separate_processes}
    for trainer in TRAINERS:  # a failed trainer is recorded; the other one still runs
        try:
            out[trainer] = (_trainer_in_child(trainer, toy, child_timeout) if separate_processes
                            else time_trainer(trainer, toy, device))
        except Exception as exc:  # noqa: BLE001 - recorded in the results, the kit goes on
            out[trainer] = {"error": f"{type(exc).__name__}: {exc}"}
    ok = [key for key in TRAINERS if "error" not in out[key]]
    if len(ok) == len(TRAINERS):
        out["ratio_megatron_over_hf"] = out["megatron_glue"]["tokens_per_s"] / out["hf_transformers"]["tokens_per_s"]
    torch.manual_seed(0)
    samples = ts.make_samples(preset)
    flops = ts.model_flops_per_token(ts.hf_config_for(preset), sum(s.total_len for s in samples) / len(samples))
    peak = peak_tflops(device)
    for key in ok:
        out[key]["tflop_per_s"] = out[key]["tokens_per_s"] * flops / 1e12
        out[key]["mfu"] = out[key]["tflop_per_s"] / peak if peak else None
    out["peak_bf16_tflops"] = peak
    if not ok:
        raise RuntimeError("; ".join(f"{k}: {out[k]['error']}" for k in TRAINERS))
    return out


def _measured(run: Callable[[], dict], device: str) -> dict:
    """Run one trainer's timing with its peak GPU memory recorded, then free what it held (in-process runs
    time both trainers one after the other)."""
    import gc

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = run()
    gc.collect()
    if device == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
    return result


def peak_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    from benchmarks.train_step import GPU_PEAK_BF16_TFLOPS

    name = torch.cuda.get_device_name()
    return next((v for k, v in GPU_PEAK_BF16_TFLOPS.items() if k in name), None)


def section_decode(toy: bool, device: str) -> dict:
    from benchmarks import decode as dc
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config.sections import ModelConfig
    from transformers import AutoModelForCausalLM

    batch, new_tokens, vocab = (4, 8, 320) if toy else (64, 256, 32000)
    torch.manual_seed(0)
    shape = {} if toy else GPU_DECODE_MODEL
    hf = hf_config_from_model_config(ModelConfig(vocab_size=vocab, max_position_embeddings=4096, **shape))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(hf).to(device=device, dtype=dtype).eval()
    prompts = dc.prompts(batch, vocab)
    lengths = dc.ragged_lengths(batch, new_tokens)
    dc.run_embedded(model, prompts[:2], 2)
    dc.run_hf(model, prompts[:2], 2)
    out: dict = {"batch": batch, "new_tokens": new_tokens, "dtype": str(dtype).replace("torch.", ""),
                 "model": shape or "embedded default"}
    for name, ragged, greedy in (("fixed", False, False), ("ragged", True, False), ("fixed_greedy", False, True)):
        emb = min(dc.run_embedded(model, prompts, new_tokens, lengths if ragged else None, greedy=greedy)
                  for _ in range(2))
        ref = min(dc.run_hf(model, prompts, max(lengths) if ragged else new_tokens, greedy=greedy) for _ in range(2))
        useful = sum(lengths) if ragged else batch * new_tokens
        out[name] = {"embedded_tokens_per_s": useful / emb, "hf_generate_tokens_per_s": useful / ref,
                     "ratio": ref / emb}
        print(f"[kit] decode {name}: embedded {useful / emb:.0f} tokens/s, HF {useful / ref:.0f}, {ref / emb:.2f}x",
              flush=True)
    return out


def section_grpo_quick(toy: bool, device: str, out_dir: Path) -> dict:
    python = sys.executable
    if toy:  # the config check in this process: a fresh one would import the same modules again (~8 s on 2 cores)
        import contextlib
        import io

        from slime_ext.config.__main__ import main as config_main

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = config_main(["--check", str(ROOT / "configs" / "grpo_quick.yaml")])
        if rc != 0:
            raise RuntimeError(f"config check failed: {err.getvalue()[-1000:]}")
        return {"checked": "configs/grpo_quick.yaml", "ran": False}
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"skipped": "ray is not installed on this machine and its wheel is over the 64 MiB a call carries"}
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "slime_ext.orchestration.driver", "configs/grpo_quick.yaml", "train.steps=4",
                           f"run.output_dir={out_dir / 'grpo_quick_runs'}", f"run.cache_dir={out_dir / 'cache'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    return {"ran": True, "returncode": done.returncode, "seconds": time.perf_counter() - start,
            "log_tail": (done.stdout + done.stderr)[-1500:]}


def run_section(name: str, fn: Callable[[], dict]) -> dict:
    """Run one section; a failure is recorded (with its traceback tail) and the kit goes on."""
    print(f"[kit] {name} ...", flush=True)
    start = time.perf_counter()
    try:
        result = {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the kit
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    result["section_seconds"] = time.perf_counter() - start
    print(f"[kit] {name}: {'ok' if result['ok'] else 'FAILED ' + result['error']} ({result['section_seconds']:.1f} s)",
          flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry", action="store_true", help="CPU, toy sizes (what CI runs)")
    parser.add_argument("--toy", action="store_true", help="toy sizes on the GPU: a quick check of the CUDA paths")
    parser.add_argument("--sections", default="train,decode,grpo_quick")
    parser.add_argument("--train-child", choices=sorted(TRAINERS), help=argparse.SUPPRESS)
    parser.add_argument("--logprob-chunk-mb", type=float, default=None,
                        help="train.logprob_chunk_mb of the Megatron trainer (default: the trainer's own)")
    args = parser.parse_args(argv)
    if args.logprob_chunk_mb is not None:  # read by benchmarks/train_step.py, here and in the trainer children
        from benchmarks.train_step import LOGPROB_CHUNK_ENV

        os.environ[LOGPROB_CHUNK_ENV] = str(args.logprob_chunk_mb)
    device = "cpu" if args.dry or not torch.cuda.is_available() else "cuda"
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not args.dry and device != "cuda":
        parser.error("no CUDA device here: run with --dry, or on the GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    toy = args.dry or args.toy
    if args.train_child:  # internal: one trainer's timing, printed as JSON for the parent kit
        print(CHILD_RESULT + json.dumps(time_trainer(args.train_child, toy, device)), flush=True)
        return 0
    sections = {"train": lambda: section_train(toy, device, separate_processes=device == "cuda"),
                "decode": lambda: section_decode(toy, device),
                "grpo_quick": lambda: section_grpo_quick(toy, device, args.out)}
    chosen = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {sorted(sections)}")
    import transformers

    meta = {"command": "python benchmarks/gpu/run_kit.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dry": args.dry, "toy": toy,
            "device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "machine": platform.node(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}
    results: dict[str, dict] = {}
    for name in chosen:  # the files are rewritten after every section: a call cut off at its limit keeps the rest
        results[name] = run_section(name, sections[name])
        (args.out / "kit.json").write_text(json.dumps({"meta": meta, "sections": results}, indent=2, default=str) + "\n")
        (args.out / "kit.md").write_text(markdown(meta, results))
    print(f"[kit] wrote {args.out}/kit.json and kit.md")
    return 0 if all(r["ok"] for r in results.values()) else 1


def _table(heading: str, note: str, header: tuple[str, ...], rows: list[str]) -> list[str]:
    return [f"## {heading}", "", note, "", "| " + " | ".join(header) + " |",
            "| --- |" + " ---: |" * (len(header) - 1), *rows, ""]


def markdown(meta: dict, results: dict) -> str:
    size = " (dry run, CPU)" if meta["dry"] else " (toy sizes)" if meta.get("toy") else ""
    lines = [f"# GPU kit{size}", "", f"- command: `{meta['command']}`",
             f"- date: {meta['date']}; device: {meta['gpu'] or meta['device']}; torch {meta['torch']}, "
             f"transformers {meta.get('transformers')}, Python {meta['python']}", ""]
    train = results.get("train", {})
    if train.get("ok"):
        rows = []
        for key in TRAINERS:
            r = train[key]
            if "error" in r:
                rows.append(f"| {key} | failed: {r['error'][:200]} | | | | |")
                continue
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
            mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "-"
            rows.append(f"| {key} | {r['seconds_per_step']:.3f} | {r['tokens_per_s']:.0f} | {r['tflop_per_s']:.3f} | "
                        f"{mfu} | {mem} |")
        lines += _table("Train step", f"preset {train['preset']}, {train['dtype']}",
                        ("trainer", "s/step", "tokens/s", "TFLOP/s", "MFU", "peak GiB"), rows)
        if "ratio_megatron_over_hf" in train:
            lines += [f"megatron_glue / HF: **{train['ratio_megatron_over_hf']:.2f}x**", ""]
    decode = results.get("decode", {})
    if decode.get("ok"):
        rows = [f"| {w} | {decode[w]['embedded_tokens_per_s']:.0f} | {decode[w]['hf_generate_tokens_per_s']:.0f} | "
                f"{decode[w]['ratio']:.2f}x |" for w in ("fixed", "ragged", "fixed_greedy")]
        lines += _table("Decode", f"batch {decode['batch']}, {decode['new_tokens']} new tokens, {decode['dtype']}",
                        ("workload", "embedded tokens/s", "HF generate tokens/s", "embedded / HF"), rows)
    for name, r in results.items():
        if not r.get("ok"):
            lines += [f"## {name}: FAILED", "", f"`{r['error']}`", ""]
    grpo = results.get("grpo_quick", {})
    if grpo.get("ok"):
        lines += ["## GRPO quick job", "", json.dumps({k: v for k, v in grpo.items() if k != "log_tail"}), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
