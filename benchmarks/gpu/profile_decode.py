"""Where a decode step's time goes on a GPU: the embedded engine and HF `generate()` under torch.profiler.

Prints, for each, wall seconds per decode step, host-side operator calls per step, device-synchronising
calls per step (`aten::_local_scalar_dense`: `.item()` / `.tolist()`), and the top operators by self CPU
and self device time. A launch-bound step shows many operator calls and device time far below wall time.

    python3 benchmarks/gpu/profile_decode.py --out $OUT     # on the GPU machine (the kit's decode model)
    python benchmarks/gpu/profile_decode.py --toy           # anywhere, toy sizes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.profiling import op_tables, profiled, write_report  # noqa: E402


def _profiled(run, device: str, steps: int) -> tuple[str, dict]:
    events, wall = profiled(run, device)
    ops = sum(e.count for e in events if e.key.startswith("aten::"))
    syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")
    summary = {"wall_s_per_step": wall / steps, "aten_ops_per_step": ops / steps, "syncs_per_step": syncs / steps}
    return op_tables(events, device, rows=18, width=48), summary


def main(argv: list[str] | None = None) -> int:
    from benchmarks import decode as dc
    from benchmarks.gpu.run_kit import GPU_DECODE_MODEL
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config.sections import ModelConfig
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, vocab = (8, 320) if args.toy else (64, 32000)
    shape = {} if args.toy else GPU_DECODE_MODEL
    torch.manual_seed(0)
    hf = hf_config_from_model_config(ModelConfig(vocab_size=vocab, max_position_embeddings=4096, **shape))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(hf).to(device=device, dtype=dtype).eval()
    prompts = dc.prompts(batch, vocab)
    dc.run_embedded(model, prompts, 4)
    dc.run_hf(model, prompts, 4)
    report = []
    for name, run in (("embedded", lambda: dc.run_embedded(model, prompts, args.steps)),
                      ("hf_generate", lambda: dc.run_hf(model, prompts, args.steps))):
        table, summary = _profiled(run, device, args.steps)
        line = f"[profile] {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
        print(line, flush=True)
        report += [line, table]
    write_report(args.out, "profile_decode.txt", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
