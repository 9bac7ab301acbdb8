"""Where the Megatron train step's time goes on a GPU: one step of the kit's gpu-moe preset under torch.profiler.

Prints the top operators by self device time and by self CPU time, and the step's wall and device seconds
(a step whose device time is far below its wall time is bound by the host: launches, syncs, Python).

    python3 benchmarks/gpu/profile_train.py --out $OUT      # on the GPU machine
    python benchmarks/gpu/profile_train.py --toy            # anywhere, toy sizes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.profiling import op_tables, profiled, write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from benchmarks import train_step as ts
    from benchmarks.gpu.run_kit import _train_preset
    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.parallel import init_distributed, init_model_parallel
    from megatron_glue.trainer import MegatronTrainer, TrainerSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset = _train_preset(args.toy, device)
    torch.manual_seed(0)
    hf_config = ts.hf_config_for(preset)
    samples = ts.make_samples(preset)
    init_distributed()
    init_model_parallel(ParallelSizes(), seed=0)
    trainer = MegatronTrainer(hf_config, TrainerSettings(lr=1e-5, micro_batch_size=preset["micro_batch"],
                                                         precision=preset["dtype"]), ParallelSizes())
    trainer.train_step(samples, kind="sft")  # warm-up
    events, wall = profiled(lambda: trainer.train_step(samples, kind="sft"), device)
    device_s = sum(e.self_device_time_total for e in events) / 1e6 if device == "cuda" else float("nan")
    experts = {type(m).__name__ for m in trainer.model.modules() if type(m).__name__.endswith("MLP")}
    head = (f"[profile] megatron train step: wall {wall:.3f} s, device busy {device_s:.3f} s, "
            f"{preset['micro_batch']} samples per micro-batch, MLP classes {sorted(experts)}")
    print(head, flush=True)
    tables = op_tables(events, device, rows=25, width=60)
    print(tables, flush=True)
    write_report(args.out, "profile_train.txt", [head, tables])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
